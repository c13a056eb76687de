"""Who sees which session and kernel, and how a reference finds one (sessions_app/querysets.py)."""

from django.contrib.auth.models import AnonymousUser

from identity_app.keypairs import main_keypair
from sessions_app.enums import Status, StatusGroup
from sessions_app.models import Kernel, Session
from tests.factories import make_session

S = Status


def test_status_groups_split_every_status_once():
    assert set(Status) == StatusGroup.LIVE | StatusGroup.FINISHED
    assert not StatusGroup.LIVE & StatusGroup.FINISHED
    assert S.ERROR in StatusGroup.LIVE and S.CANCELLED in StatusGroup.FINISHED


def test_live_and_finished(alice):
    running = make_session(alice, S.RUNNING, name="a")
    ended = make_session(alice, S.TERMINATED, name="b")
    assert list(Session.objects.live()) == [running]
    assert list(Session.objects.finished()) == [ended]
    assert set(Kernel.objects.live()) == set(running.kernels.all())
    assert set(Kernel.objects.finished()) == set(ended.kernels.all())


def test_users_see_their_own_admins_everything_anonymous_nothing(alice, bob, carol):
    mine = make_session(alice, name="mine")
    theirs = make_session(bob, name="theirs")
    assert list(Session.objects.visible_to(alice)) == [mine]
    assert set(Session.objects.visible_to(carol)) == {mine, theirs}
    assert not Session.objects.visible_to(AnonymousUser()).exists()
    assert set(Kernel.objects.visible_to(alice)) == set(mine.kernels.all())
    assert set(Kernel.objects.visible_to(carol)) == set(Kernel.objects.all())


def test_an_admin_keypair_makes_its_user_an_admin(alice, bob):
    make_session(bob, name="theirs")
    keypair = main_keypair(alice)
    assert not Session.objects.visible_to(alice, keypair).exists()
    keypair.is_admin = True
    keypair.save()
    assert Session.objects.visible_to(alice, keypair).count() == 1


def test_find_by_id_then_by_name_live_first(alice):
    old = make_session(alice, S.TERMINATED, name="work")
    live = make_session(alice, S.RUNNING, name="work")
    assert Session.objects.find(str(old.pk)) == old
    assert Session.objects.find("work") == live
    assert Session.objects.find("nothing") is None
    assert Kernel.objects.find(str(live.main_kernel.pk)) == live.main_kernel
    assert Kernel.objects.find("not-an-id") is None


def test_find_a_finished_session_by_name_gives_the_most_recent(alice):
    make_session(alice, S.TERMINATED, name="work")
    newer = make_session(alice, S.CANCELLED, name="work")
    assert Session.objects.find("work") == newer


def test_find_among_the_visible_only(alice, bob):
    theirs = make_session(bob, name="theirs")
    assert Session.objects.visible_to(alice).find(str(theirs.pk)) is None
    assert Session.objects.visible_to(alice).find("theirs") is None
