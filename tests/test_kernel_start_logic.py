"""The pure parts of a kernel's start (agents_app/runtime): the SSH client configuration of a
cluster, the init's words for a command it cannot execute, the step a failure names."""

import io
import tarfile

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import errors, services
from agents_app.runtime.provisioners import passwd_with_user, ssh_archive
from agents_app.runtime.runner import ProvisionFailed

KEYPAIR = {"private": "PRIVATE\n", "public": "ssh-ed25519 AAAA backendai-cluster\n"}


def files_of(archive):
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: (tar.extractfile(m).read().decode() if m.isfile() else None, m.mode)
                for m in tar.getmembers()}


def test_a_cluster_kernel_gets_the_key_and_a_client_configuration_naming_every_host():
    files = files_of(ssh_archive(KEYPAIR, ["main1", "sub1", "sub2"]))
    assert files["home/work/.ssh/id_cluster"] == ("PRIVATE\n", 0o600)
    assert files["home/work/.ssh/authorized_keys"][0] == KEYPAIR["public"]
    config, mode = files["etc/ssh/ssh_config.d/backendai-cluster.conf"]
    assert mode == 0o644
    lines = [line.strip() for line in config.splitlines()]
    assert "Host main1 sub1 sub2" in lines
    assert {"Port 2200", "IdentityFile /home/work/.ssh/id_cluster", "BatchMode yes",
            "StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"} <= set(lines)


def test_without_hosts_only_the_key_goes_in():
    assert not any(name.startswith("etc/") for name in files_of(ssh_archive(KEYPAIR)))


def test_the_inits_words_for_a_command_it_cannot_execute_are_found_in_a_log():
    log = "[FATAL tini (7)] exec nosuchcmd failed: No such file or directory\n"
    assert backend.INIT_EXEC_FAILED.search(log).group(1) == (
        "exec nosuchcmd failed: No such file or directory")
    assert backend.INIT_EXEC_FAILED.search("sh: nosuchcmd: not found\n") is None


def test_a_failure_names_its_step_and_keeps_the_kind_of_its_cause():
    failed = ProvisionFailed("folder-mounts", errors.AgentCannotRun(
        "storage folder 'data' is not on this host (/x: No such file or directory)"))
    assert str(failed) == ("folder-mounts: storage folder 'data' is not on this host "
                           "(/x: No such file or directory)")
    assert (failed.provisioner, failed.kind) == ("folder-mounts", errors.AGENT)
    assert ProvisionFailed("readiness", services.NotReady("web did not answer")).kind == \
        errors.TRANSIENT


def owners_of(archive):
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: (m.uid, m.gid, m.mode) for m in tar.getmembers()}


def test_a_kernel_runs_as_its_groups_user_and_as_1000_when_the_manager_names_none():
    assert backend.hardening({"kernel_uid": 1234, "kernel_gid": 55})["user"] == "1234:55"
    assert backend.hardening({"kernel_uid": 0, "kernel_gid": 0})["user"] == "0:0"  # root, asked
    assert backend.hardening({})["user"] == "1000:1000"
    assert backend.kernel_environment({
        "session_id": "s", "session_name": "n", "kernel_id": "k", "cluster_role": "main",
        "cluster_idx": 1, "cluster_hostname": "main1", "cluster_size": 1})["HOME"] == "/home/work"


def test_the_cluster_keys_home_and_dropbear_directory_are_the_kernels_users():
    owners = owners_of(ssh_archive(KEYPAIR, ["main1"], (1234, 55), passwd=""))
    assert owners["home"] == (0, 0, 0o755)
    assert owners["home/work"] == (1234, 55, 0o755)
    assert owners["home/work/.ssh"] == (1234, 55, 0o700)
    assert owners["home/work/.ssh/id_cluster"] == (1234, 55, 0o600)
    assert owners["etc/dropbear"] == (1234, 55, 0o700)
    assert owners["etc/ssh/ssh_config.d/backendai-cluster.conf"][:2] == (0, 0)
    assert files_of(ssh_archive(KEYPAIR, [], (1234, 55), passwd=""))["etc/passwd"] == (
        "work:x:1234:55:work:/home/work:/bin/sh\n", 0o644)
    root = owners_of(ssh_archive(KEYPAIR, [], (0, 0)))  # a root kernel: as before
    assert "etc/dropbear" not in root and "etc/passwd" not in root
    assert root["home/work/.ssh/id_cluster"] == (0, 0, 0o600)


def test_a_passwd_entry_is_added_only_for_a_uid_the_image_does_not_know():
    image = "root:x:0:0:root:/root:/bin/sh\nwork:x:1000:1000::/home/work:/bin/bash\n"
    assert passwd_with_user(image, 1000, 1000) is None
    assert passwd_with_user(image, 1234, 55).splitlines()[-1] == (
        "work1234:x:1234:55:work:/home/work:/bin/sh")  # `work` is taken by another uid
    assert passwd_with_user(image, 1234, 55).startswith(image)
