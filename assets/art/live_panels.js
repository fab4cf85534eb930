// The kitchen's two panels while an order cooks (kitchen_viz/live_panels.py): built once per
// mount, then each update only changes a few text nodes and one polyline. Nothing animates and
// the box keeps its size, so an update repaints a few small rectangles and nothing else.

const ROOTS = new WeakMap();
const DRAWN = new WeakMap(); // root -> the data it shows (JSON), kept off the DOM
const W = 300;
const H = 56;

export default function (component) {
  const { data, parentElement } = component;
  let root = ROOTS.get(parentElement);
  if (!root || !root.isConnected) {
    root = mount(parentElement);
    ROOTS.set(parentElement, root);
  }
  const key = data ? JSON.stringify(data) : null;
  if (data && key !== DRAWN.get(root)) update(root, data); // nothing new measured: touch nothing
  DRAWN.set(root, key);
}

function mount(parent) {
  const root = document.createElement("div");
  root.className = "tpk-live-panels";
  root.innerHTML = `
    <section class="tpk-lp tpk-lp-wok">
      <div class="tpk-lp-title">🔥 The wok · prefill</div>
      <div class="tpk-lp-row">
        <div class="tpk-lp-metric"><div class="tpk-lp-label">TTFT</div><div class="tpk-lp-value" data-k="ttft">—</div></div>
        <div class="tpk-lp-metric"><div class="tpk-lp-label">E2E</div><div class="tpk-lp-value" data-k="e2e">—</div></div>
      </div>
      <div class="tpk-lp-note" data-k="wait"></div>
    </section>
    <section class="tpk-lp tpk-lp-pot">
      <div class="tpk-lp-title">🍲 The soup pot · decode <span class="tpk-lp-live">LIVE</span></div>
      <div class="tpk-lp-row">
        <div class="tpk-lp-metric"><div class="tpk-lp-label">TPOT (so far)</div><div class="tpk-lp-value" data-k="tpot">—</div></div>
        <div class="tpk-lp-metric"><div class="tpk-lp-label">Tokens/s, all tables (so far)</div><div class="tpk-lp-value" data-k="tps">—</div></div>
        <div class="tpk-lp-spark">
          <div class="tpk-lp-label">ITL per decode step (ms) · latest <span data-k="latest_itl">—</span></div>
          <svg viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" class="tpk-lp-svg" aria-label="ITL of every decode step so far">
            <polyline class="tpk-lp-line" points=""/>
          </svg>
          <div class="tpk-lp-axis" data-k="axis"></div>
        </div>
      </div>
    </section>`;
  parent.appendChild(root);
  return root;
}

function update(root, d) {
  for (const el of root.querySelectorAll("[data-k]")) {
    const k = el.dataset.k;
    if (k in d && el.textContent !== String(d[k])) el.textContent = d[k];
  }
  const ms = d.itl_ms || [];
  const top = Math.max(...ms, 1e-9);
  const n = Math.max(ms.length - 1, 1);
  const pts = ms.map((v, i) => `${((i / n) * W).toFixed(1)},${(H - 2 - (v / top) * (H - 6)).toFixed(1)}`).join(" ");
  const line = root.querySelector(".tpk-lp-line");
  if (line.getAttribute("points") !== pts) line.setAttribute("points", pts);
  const axis = ms.length ? `${d.steps} steps · slowest ${top.toFixed(2)} ms` : "the pot has not started ladling yet";
  const a = root.querySelector('[data-k="axis"]');
  if (a.textContent !== axis) a.textContent = axis;
}
