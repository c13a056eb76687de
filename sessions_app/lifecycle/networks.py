"""A session's network across hosts (an overlay): made when the scheduler places the session
on more than one agent, a warm one claimed where the pool has one; removed when the session
has ended. The engine announces both (it sends no agent call); these receivers answer,
connected when the app loads (sessions_app.apps)."""

from django.db import transaction
from django.dispatch import receiver

from agents_app import network_pool, rpc
from sessions_app import engine


@receiver(engine.sessions_spread, dispatch_uid="lifecycle.networks.make")
def make_session_networks(sender, session_ids, **kwargs):
    """In the scheduler's transaction: claim a network made ahead where there is one; after
    commit, ask for the others and let the other agents drop the claimed ones' holders."""
    warm = network_pool.claim(session_ids)

    def after_commit():
        rpc.send_create_network([sid for sid in session_ids if sid not in warm])
        network_pool.release_others(warm)

    transaction.on_commit(after_commit)


@receiver(engine.spread_session_ended, dispatch_uid="lifecycle.networks.remove")
def remove_session_network(sender, session, **kwargs):
    """Its last kernel has ended: the overlay goes after commit (the heartbeats of manager
    agents ask again for any that stays)."""
    transaction.on_commit(lambda: rpc.send_remove_network(session.pk, session=session))
