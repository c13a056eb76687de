// /sessions/new/: the cpu and memory fields start at the chosen image's minimum (its
// ai.backend.resource.min.* labels), which is also their lower bound.
const image = document.getElementById("id_image");
const minimums = JSON.parse(image?.dataset.minimums || "{}");
const fields = { cpu: document.getElementById("id_cpu"), mem: document.getElementById("id_mem") };
const defaults = { cpu: fields.cpu?.min, mem: fields.mem?.min };

function follow(raise) {
  const least = minimums[image.value] || {};
  for (const [name, input] of Object.entries(fields)) {
    if (!input) continue;
    input.min = least[name] ?? defaults[name];
    if (raise && least[name] !== undefined && Number(input.value) < least[name]) {
      input.value = least[name];
    }
  }
}

if (image) {
  follow(false);
  image.addEventListener("change", () => follow(true));
}
