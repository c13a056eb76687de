"""The dashboard's Folders pages, the create form's folder choice and a session's mounts."""

import pytest
from django.test import Client

from sessions_app.models import Session
from storage_app.models import Folder
from tests.factories import make_session


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.STORAGE_ROOT = tmp_path / "storage"


def test_create_list_and_delete_a_folder_from_the_dashboard(as_alice, alice):
    created = as_alice.post("/folders/new/", {"name": "notes"})
    folder = Folder.objects.get(name="notes", user=alice)
    assert created.status_code == 302 and created["Location"] == f"/folders/{folder.pk}/"
    page = as_alice.get("/folders/").content.decode()
    assert 'id="folder-notes"' in page and "0\xa0bytes" in page
    detail = as_alice.get(f"/folders/{folder.pk}/").content.decode()
    assert 'data-writable="true"' in detail and 'id="dropzone"' in detail
    again = as_alice.post("/folders/new/", {"name": "notes"}, follow=True)
    assert "already" in again.content.decode()
    session = make_session(alice, name="user-of-notes", mounts=["notes"])
    refused = as_alice.post(f"/folders/{folder.pk}/delete/", follow=True).content.decode()
    assert "user-of-notes" in refused and Folder.objects.filter(pk=folder.pk).exists()
    Session.objects.filter(pk=session.pk).update(status="CANCELLED")
    as_alice.post(f"/folders/{folder.pk}/delete/")
    assert not Folder.objects.filter(pk=folder.pk).exists()


def test_another_users_folder_page_is_a_404(as_alice, bob):
    as_alice.post("/folders/new/", {"name": "private"})
    folder = Folder.objects.get(name="private")
    other = Client()
    other.force_login(bob)
    assert other.get(f"/folders/{folder.pk}/").status_code == 404
    assert other.post(f"/folders/{folder.pk}/delete/").status_code == 404
    assert "private" not in other.get("/folders/").content.decode()


def test_the_create_form_mounts_chosen_folders_and_the_session_page_shows_them(as_alice):
    as_alice.post("/folders/new/", {"name": "data"})
    form = as_alice.get("/sessions/new/").content.decode()
    assert 'name="mounts" value="data"' in form
    created = as_alice.post("/sessions/new/", {
        "name": "with-data", "image": "bai-local/busybox:latest", "session_type": "interactive",
        "cpu": "1", "mem": "256", "cluster_size": "1", "mounts": ["data"]})
    assert created.status_code == 302, created.content.decode()[:2000]
    session = Session.objects.get(name="with-data")
    page = as_alice.get(f"/sessions/{session.pk}/").content.decode()
    assert 'id="mounts"' in page and "/home/work/data" in page
