"""The `backend.ai` commands that read through GraphQL (/admin/gql), with both client
releases (23.9.10 and 26.9.6: see `backendai_cli`) against the running system: `ps`,
`session list` with its status filters and paging, `session info`, `admin session list`,
`admin agent list|info`, `image list` / `admin image list`, `admin keypair list|info`; what
each shows and what a user does not see of another's. The schema's answers without Docker
are in tests/test_graphql.py."""

import pytest

from identity_app.keypairs import main_keypair
from sessions_app.enums import Status
from sessions_app.models import Session
from tests.support import IMAGE, wait_for

pytestmark = pytest.mark.docker


def rows(output):
    """The table rows a list command printed, as lists of cells (header and rule left out)."""
    lines = [line for line in output.splitlines() if line.strip()]
    if len(lines) > 1 and set(lines[1].replace(" ", "")) == {"-"}:
        lines = lines[2:]
    return [line.split() for line in lines]


def names_in(output):
    return {cells[0] for cells in rows(output)}


def create(backendai, keypair, name):
    # Small: three sessions must fit on the agent of a 2-core machine.
    code, out = backendai(keypair, "create", "--name", name, "-r", "cpu=0.5", "-r", "mem=128m",
                          IMAGE)
    assert code == 0, out
    return Session.objects.get(name=name, keypair=keypair)


# Some twenty CLI runs: 26.9.6 takes 3 s of CPU to start, over 10 s on a loaded 2-core machine.
@pytest.mark.timeout(900)
def test_the_cli_lists_and_shows_sessions_by_owner_status_and_page(backendai, live, alice,
                                                                   bob, carol):
    alice_kp, bob_kp, admin_kp = main_keypair(alice), main_keypair(bob), main_keypair(carol)
    first = create(backendai, alice_kp, "gql-a1")
    second = create(backendai, alice_kp, "gql-a2")
    bobs = create(backendai, bob_kp, "gql-b1")

    # ps / session list: a user's own live sessions, never another user's.
    for command in (["ps"], ["session", "list"]):
        code, out = backendai(alice_kp, *command)
        assert code == 0, out
        assert names_in(out) == {"gql-a1", "gql-a2"}, out
        assert str(first.pk) in out and "RUNNING" in out and bobs.name not in out
    code, out = backendai(bob_kp, "ps")
    assert code == 0 and names_in(out) == {"gql-b1"}, out

    # session info by id: the session, its container on the live agent; another user's
    # session is "no such session".
    code, out = backendai(alice_kp, "session", "info", str(first.pk))
    assert code == 0, out
    first.refresh_from_db()
    kernel = first.kernels.get()
    assert "gql-a1" in out and str(first.pk) in out and str(kernel.pk) in out
    assert live.agent_id in out and kernel.container_id in out, out
    assert "cpu:0.5" in out and "mem:128.0M" in out  # occupying slots, as the client formats
    code, out = backendai(alice_kp, "session", "info", str(bobs.pk))
    assert code == 1 and "There is no such compute session." in out, out

    # The admin's list shows everyone's sessions with their owners' access keys.
    code, out = backendai(admin_kp, "admin", "session", "list")
    assert code == 0, out
    owners = {cells[0]: cells[1] for cells in rows(out)}
    assert owners["gql-a1"] == owners["gql-a2"] == alice_kp.access_key
    assert owners["gql-b1"] == bob_kp.access_key

    # Paging: --offset skips (newest first), --limit is the page size (23.9.10 reads page
    # after page of that size, 26.9.6 stops after --limit rows).
    code, out = backendai(alice_kp, "ps", "--all", "--name-only", "--offset", "1",
                          "--limit", "1")
    assert code == 0 and [cells[0] for cells in rows(out)] == ["gql-a1"], out
    code, out = backendai(alice_kp, "ps", "--all", "--name-only", "--limit", "1")
    expected = ["gql-a2", "gql-a1"] if backendai.release == "23.9.10" else ["gql-a2"]
    assert code == 0 and [cells[0] for cells in rows(out)] == expected, out

    # Status filters: a destroyed session leaves ps and shows under --dead.
    code, out = backendai(alice_kp, "rm", "gql-a2")
    assert code == 0, out
    wait_for(lambda: Session.objects.get(pk=second.pk).status == Status.TERMINATED,
             timeout=90, message="gql-a2 TERMINATED")
    code, out = backendai(alice_kp, "ps")
    assert code == 0 and names_in(out) == {"gql-a1"}, out
    code, out = backendai(alice_kp, "ps", "--dead")
    assert code == 0 and names_in(out) == {"gql-a2"} and "TERMINATED" in out, out
    code, out = backendai(alice_kp, "ps", "--status", "RUNNING")
    assert code == 0 and names_in(out) == {"gql-a1"}, out
    code, out = backendai(alice_kp, "ps", "--all")
    assert code == 0 and names_in(out) == {"gql-a1", "gql-a2"}, out

    for name, keypair in (("gql-a1", alice_kp), ("gql-b1", bob_kp)):
        code, out = backendai(keypair, "rm", name)
        assert code == 0, out


@pytest.mark.timeout(600)  # a dozen CLI runs (see above)
def test_the_cli_lists_agents_images_and_keypairs(backendai, live, alice, bob, carol):
    alice_kp, bob_kp, admin_kp = main_keypair(alice), main_keypair(bob), main_keypair(carol)

    # Agents: admins only.
    code, out = backendai(admin_kp, "admin", "agent", "list")
    assert code == 0, out
    [agent_row] = [cells for cells in rows(out) if cells[0] == live.agent_id]
    assert agent_row[1] == "ALIVE", out
    code, out = backendai(admin_kp, "admin", "agent", "info", live.agent_id)
    assert code == 0 and live.agent_id in out and "Available Slots" in out, out
    code, out = backendai(alice_kp, "admin", "agent", "list")
    assert code == 1 and "Only administrators may see agents." in out, out

    # Images: everyone; name and tag apart, as the manager answers them.
    image_name, _, tag = IMAGE.rpartition(":")
    commands = [["admin", "image", "list"]]
    if backendai.release != "23.9.10":  # 23.9.10 has no `image` group
        commands.append(["image", "list"])
    for command in commands:
        code, out = backendai(alice_kp, *command)
        assert code == 0, out
        assert [image_name, "local", "x86_64", tag] in [cells[:4] for cells in rows(out)], out

    # Keypairs: a user sees their own (with its secret, which they hold), an admin all (and
    # no one else's secret).
    code, out = backendai(alice_kp, "admin", "keypair", "list")
    assert code == 0, out
    assert [cells[0] for cells in rows(out)] == ["alice@example.com"], out
    assert alice_kp.secret_key in out
    code, out = backendai(admin_kp, "admin", "keypair", "list")
    assert code == 0, out
    listed = {cells[0]: cells for cells in rows(out)}
    assert {"alice@example.com", "bob@example.com", "carol@example.com"} <= set(listed)
    assert alice_kp.access_key in listed["alice@example.com"]
    assert bob_kp.access_key in listed["bob@example.com"]
    assert alice_kp.secret_key not in out and bob_kp.secret_key not in out
    code, out = backendai(alice_kp, "admin", "keypair", "info")
    assert code == 0 and alice_kp.access_key in out and "alice@example.com" in out, out
