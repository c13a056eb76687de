// /sessions/new/: the cpu and memory fields start at the chosen image's minimum (its
// ai.backend.resource.min.* labels), which is also their lower bound; an image that needs
// a device chooses it. Whole devices are counted in steps of one, shares of a device in
// hundredths.
const image = document.getElementById("id_image");
const minimums = JSON.parse(image?.dataset.minimums || "{}");
const fields = { cpu: document.getElementById("id_cpu"), mem: document.getElementById("id_mem") };
const defaults = { cpu: fields.cpu?.min, mem: fields.mem?.min };
const accelerator = document.getElementById("id_accelerator");
const amount = document.getElementById("id_accelerators");

function follow(raise) {
  const least = minimums[image.value] || {};
  for (const [name, input] of Object.entries(fields)) {
    if (!input) continue;
    input.min = least[name] ?? defaults[name];
    if (raise && least[name] !== undefined && Number(input.value) < least[name]) {
      input.value = least[name];
    }
  }
  if (raise && least.accelerator && accelerator && amount && !accelerator.value) {
    accelerator.value = least.accelerator;
    amount.value = least.accelerators;
  }
  stepOfAmount();
}

function stepOfAmount() {
  if (!accelerator || !amount) return;
  const whole = accelerator.value.endsWith(".device");
  amount.step = whole ? "1" : "0.01";
  amount.min = whole ? "1" : "0.01";
  amount.disabled = !accelerator.value;
}

if (image) {
  follow(false);
  image.addEventListener("change", () => follow(true));
}
accelerator?.addEventListener("change", stepOfAmount);
