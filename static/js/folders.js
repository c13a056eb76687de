// /folders/ and /folders/<id>/: the folder browser over /api/v1/folders/<id>/.
// Uploads go in resumable parts (tus 1.0: POST uploads/, then PATCH each part), so the
// web process never holds more than a part; the bar shows the bytes the browser sent.
import { csrfToken } from "./live.js";

const PART = 8 * 1024 * 1024;
const folder = document.getElementById("folder");

if (folder) {
  const api = `/api/v1/folders/${folder.dataset.folderId}/`;
  const writable = folder.dataset.writable === "true";
  const rows = document.getElementById("file-rows");
  const crumbs = document.getElementById("breadcrumbs");
  const errorBox = document.getElementById("files-error");
  let cwd = new URLSearchParams(location.hash.slice(1)).get("path") || "";

  const join = (dir, name) => (dir ? `${dir}/${name}` : name);
  const headers = (extra = {}) => ({ "X-CSRFToken": csrfToken(), ...extra });

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = !message;
  }

  async function call(url, options = {}) {
    const response = await fetch(url, { credentials: "same-origin", ...options,
                                        headers: headers(options.headers) });
    if (!response.ok) {
      let message = `${response.status} ${response.statusText}`;
      try { message = (await response.json()).msg || message; } catch { /* not JSON */ }
      throw new Error(message);
    }
    return response;
  }

  function formatSize(bytes) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let value = bytes, unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
    return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
  }

  function renderCrumbs() {
    crumbs.replaceChildren();
    const parts = cwd ? cwd.split("/") : [];
    const link = (label, path) => {
      const a = document.createElement("a");
      a.href = `#path=${encodeURIComponent(path)}`;
      a.textContent = label;
      a.addEventListener("click", (event) => { event.preventDefault(); open(path); });
      return a;
    };
    crumbs.append(link("(top)", ""));
    parts.forEach((part, i) => {
      crumbs.append(" / ", link(part, parts.slice(0, i + 1).join("/")));
    });
  }

  function row(entry) {
    const tr = document.createElement("tr");
    tr.dataset.name = entry.name;
    tr.dataset.type = entry.type;
    const name = document.createElement("td");
    const path = join(cwd, entry.name);
    if (entry.type === "dir") {
      const a = document.createElement("a");
      a.href = `#path=${encodeURIComponent(path)}`;
      a.textContent = `${entry.name}/`;
      a.addEventListener("click", (event) => { event.preventDefault(); open(path); });
      name.append(a);
    } else if (entry.type === "file") {
      const a = document.createElement("a");
      a.href = `${api}download/?path=${encodeURIComponent(path)}`;
      a.textContent = entry.name;
      a.className = "download";
      a.setAttribute("download", entry.name);
      name.append(a);
    } else {
      name.textContent = `${entry.name} (${entry.type}, not followed)`;
    }
    const size = document.createElement("td");
    size.textContent = entry.type === "dir" ? "" : formatSize(entry.size);
    const mtime = document.createElement("td");
    mtime.textContent = new Date(entry.mtime * 1000).toLocaleString();
    const actions = document.createElement("td");
    if (writable) {
      const remove = document.createElement("button");
      remove.className = "danger outline small";
      remove.textContent = "Delete";
      remove.addEventListener("click", async () => {
        if (!window.confirm(`Delete ${path}${entry.type === "dir" ? " and everything in it" : ""}?`)) return;
        try {
          await call(`${api}files/?path=${encodeURIComponent(path)}&recursive=1`, { method: "DELETE" });
          await open(cwd);
        } catch (error) { showError(error.message); }
      });
      actions.append(remove);
    }
    tr.append(name, size, mtime, actions);
    return tr;
  }

  async function open(path) {
    try {
      const response = await call(`${api}files/?path=${encodeURIComponent(path)}`);
      const entries = await response.json();
      cwd = path;
      history.replaceState(null, "", path ? `#path=${encodeURIComponent(path)}` : "#");
      renderCrumbs();
      rows.replaceChildren(...entries.map(row));
      if (!entries.length) {
        const tr = document.createElement("tr");
        tr.className = "empty";
        tr.innerHTML = '<td colspan="4">Empty.</td>';
        rows.append(tr);
      }
      showError("");
    } catch (error) { showError(error.message); }
  }

  // One PATCH of one part, through XMLHttpRequest for its upload progress events.
  function sendPart(url, offset, blob, onProgress) {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open("PATCH", url);
      xhr.setRequestHeader("X-CSRFToken", csrfToken());
      xhr.setRequestHeader("Tus-Resumable", "1.0.0");
      xhr.setRequestHeader("Upload-Offset", String(offset));
      xhr.setRequestHeader("Content-Type", "application/offset+octet-stream");
      xhr.upload.onprogress = (event) => onProgress(event.loaded);
      xhr.onload = () => {
        if (xhr.status === 204) resolve(Number(xhr.getResponseHeader("Upload-Offset")));
        else {
          let message = `${xhr.status} ${xhr.statusText}`;
          try { message = JSON.parse(xhr.responseText).msg || message; } catch { /* keep */ }
          reject(new Error(message));
        }
      };
      xhr.onerror = () => reject(new Error("The connection failed during the upload."));
      xhr.send(blob);
    });
  }

  async function upload(files) {
    const block = document.getElementById("upload-progress");
    const bar = block.querySelector(".progress-bar");
    const label = document.getElementById("upload-label");
    const total = [...files].reduce((sum, f) => sum + f.size, 0);
    let done = 0;
    block.hidden = false;
    const show = (sent, name) => {
      const percent = total ? Math.floor((100 * sent) / total) : 100;
      bar.style.width = `${percent}%`;
      block.querySelector(".progress").setAttribute("aria-valuenow", String(percent));
      label.textContent = `${name}: ${formatSize(sent)} of ${formatSize(total)} (${percent}%)`;
    };
    try {
      for (const file of files) {
        const path = join(cwd, file.name);
        const started = await call(`${api}uploads/`, {
          method: "POST",
          headers: { "Tus-Resumable": "1.0.0", "Upload-Length": String(file.size),
                     "Upload-Metadata": `path ${btoa(unescape(encodeURIComponent(path)))}` },
        });
        const url = started.headers.get("Location");
        let offset = 0;
        while (offset < file.size) {
          const part = file.slice(offset, offset + PART);
          const base = done + offset;
          offset = await sendPart(url, offset, part, (loaded) => show(base + loaded, file.name));
        }
        done += file.size;
        show(done, file.name);
      }
      label.textContent = `Uploaded ${files.length} file${files.length === 1 ? "" : "s"} (${formatSize(total)}).`;
      block.dataset.state = "done";
    } catch (error) {
      showError(`The upload failed: ${error.message}`);
      block.dataset.state = "failed";
    }
    await open(cwd);
  }

  if (writable) {
    const zone = document.getElementById("dropzone");
    const input = document.getElementById("file-input");
    zone.addEventListener("dragover", (event) => { event.preventDefault(); zone.classList.add("over"); });
    zone.addEventListener("dragleave", () => zone.classList.remove("over"));
    zone.addEventListener("drop", (event) => {
      event.preventDefault();
      zone.classList.remove("over");
      if (event.dataTransfer.files.length) upload(event.dataTransfer.files);
    });
    input.addEventListener("change", () => { if (input.files.length) upload(input.files); });
    document.getElementById("mkdir").addEventListener("submit", async (event) => {
      event.preventDefault();
      const name = event.target.elements.name.value.trim();
      if (!name) return;
      try {
        await call(`${api}mkdir/`, { method: "POST", headers: { "Content-Type": "application/json" },
                                    body: JSON.stringify({ path: join(cwd, name) }) });
        event.target.reset();
        await open(cwd);
      } catch (error) { showError(error.message); }
    });
  }
  open(cwd);
}
