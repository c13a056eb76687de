"""Storage folders end to end in Chromium: create a folder, upload by drag-and-drop and by
the file chooser (in parts, with the progress bar), start a session with the folder
mounted, read the file with the command box, download files back."""

import hashlib
import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from scheduling_app.models import ScalingGroup
from sessions_app.models import Session, Status
from storage_app.models import Folder
from tests.live.test_browser import (  # noqa: F401 (fixtures)
    TIMEOUT_MS,
    browser_context,
    chromium,
    log_in,
    passwords_the_server_can_check,
    screenshot,
    web,
)

pytestmark = [pytest.mark.browser, pytest.mark.docker]

DROP_FILE = """
(text) => {
  const transfer = new DataTransfer();
  transfer.items.add(new File([text], "note.txt", { type: "text/plain" }));
  document.getElementById("dropzone").dispatchEvent(
    new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true }));
}
"""


def test_folder_upload_mount_read_and_download_in_a_real_browser(
        live, alice, browser_context, tmp_path):  # noqa: F811 (the fixture imported above)
    storage = tmp_path / "storage"
    ScalingGroup.objects.filter(name="default").update(storage_root=str(storage))
    page = browser_context.new_page()
    log_in(page, "alice")
    page.click("text=Folders")
    page.wait_for_url("**/folders/")
    page.fill("#folder-name", "shared-data")
    page.click("#folder-create button[type=submit]")
    page.wait_for_url("**/folders/*-*/")
    folder = Folder.objects.get(name="shared-data", user=alice)
    expect(page.locator("#file-rows")).to_contain_text("Empty.")

    page.evaluate(DROP_FILE, "hello from the browser\n")
    expect(page.locator("#upload-progress")).to_have_attribute("data-state", "done")
    expect(page.locator('#file-rows tr[data-name="note.txt"]')).to_be_visible()
    assert (storage / folder.id.hex / "note.txt").read_text() == "hello from the browser\n"

    # A file of several parts through the file chooser: the bar ends full.
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(20 * 1024 * 1024 + 123))
    page.set_input_files("#file-input", str(big))
    expect(page.locator("#upload-progress")).to_have_attribute("data-state", "done")
    expect(page.locator("#upload-progress .progress")).to_have_attribute("aria-valuenow", "100")
    expect(page.locator('#file-rows tr[data-name="big.bin"]')).to_be_visible()
    screenshot(page, "storage-01-folder-uploaded")

    page.click("text=New session")
    page.wait_for_url("**/sessions/new/")
    page.fill("#id_name", "with-folder")
    page.fill("#id_cpu", "0.5")
    page.fill("#id_mem", "128")
    page.check('input[name=mounts][value="shared-data"]')
    page.click("#session-form button[type=submit]")
    page.wait_for_url("**/sessions/*-*/")
    session = Session.objects.get(name="with-folder")
    expect(page.locator("#mounts")).to_contain_text("/home/work/shared-data")
    expect(page.locator(f'[data-status-of="{session.pk}"]').first).to_have_text(
        Status.RUNNING, timeout=TIMEOUT_MS)
    expect(page.locator("#execute-run")).to_be_enabled()
    page.fill("#execute-command", "cat /home/work/shared-data/note.txt && "
                                  "echo written-in-the-session > /home/work/shared-data/made.txt")
    page.click("#execute-run")
    expect(page.locator("#execute-stdout")).to_contain_text("hello from the browser")
    expect(page.locator("#execute-exit-code")).to_have_text("0")
    screenshot(page, "storage-02-read-in-session")

    page.click("#mounts a")
    page.wait_for_url(f"**/folders/{folder.pk}/")
    expect(page.locator('#file-rows tr[data-name="made.txt"]')).to_be_visible()
    with page.expect_download() as made:
        page.click('#file-rows tr[data-name="made.txt"] a.download')
    assert Path(made.value.path()).read_text() == "written-in-the-session\n"
    with page.expect_download() as back:
        page.click('#file-rows tr[data-name="big.bin"] a.download')
    assert hashlib.sha256(Path(back.value.path()).read_bytes()).digest() == \
        hashlib.sha256(big.read_bytes()).digest()
    screenshot(page, "storage-03-downloaded")
