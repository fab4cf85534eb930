// The two-pot kitchen, replayed from the engine's measured timestamps.
//
// `data` (kitchen_viz/timeline.py: LiveRun.scene_data) arrives several times a second while a Cook
// runs: streamed to this script by the order's feed, or sent by the page's fragment ticks (see
// follow() below). Two ways of drawing, one picture:
//
//   live     while the engine cooks (data.t_done is null): ONE still frame per update, the
//            kitchen as it is at the latest measured moment (T = the last event's time). No
//            animation frames, no CSS animation or transition: on a small machine the browser's
//            drawing shares cores with the engine being measured, and a still frame twice a second
//            costs a fraction of 25 animated frames (docs/benchmarks/ui-overhead.md).
//   replay   once the order is done: ONE playback clock per mounted scene, the kitchen as it
//            was at engine time T = (screen seconds since the replay began) / slowdown, with
//            all its motion.
//
// Every position, fill and label below is a function of T and the measured events, nothing else.
// With prefers-reduced-motion, decorative motion (flicker, toss, ladle swing, slides) is off;
// the states still change at their measured moments.

const SVG = __KITCHEN_SVG__;
const SCENES = new WeakMap();
const TABLE_W = 140;
const BOWLS_PER_ROW = 6;
const BOWL_ROWS = 4; // up to 8 tables: one row, four rows of bowls each
const COMPACT_BOWL_ROWS = 2; // 9 to 16 tables: two rows of eight, two rows of bowls each
const PER_ROW = 8;
const FRAME_MS = 40;
const TICK_MS = 250; // the live clock's tick while a long prefill has nothing new to report
const LIVE_TEXT_TOKENS = 48; // a table's text while the engine cooks: its latest tokens (all of it in the replay)
const SPARK_POINTS = 120; // the live ITL line: at most this many points (each the slowest step of its stretch)

export default function (component) {
  const { data, parentElement } = component;
  let scene = SCENES.get(parentElement);
  if (!scene || !scene.root.isConnected) {
    scene = mount(parentElement);
    SCENES.set(parentElement, scene);
  }
  scene.say = component.setTriggerValue;
  if (data) receive(scene, data);
  follow(scene, data && data.t_done === null ? data.feed : null);
}

// ---------------------------------------------------------------- the feed (kitchen_viz/live_feed.py)
//
// Under `two-pot-kitchen` the page draws the scene once per Cook and names the order's feed: a
// stream of server-sent events that carries the order's state each time it changed (at most two
// times a second; no Streamlit rerun per update, and no request per update either: measured
// cheaper for a browser that shares the engine's machine). When the feed says the order is done,
// the scene triggers one rerun ("done") so the page draws the final numbers, and says it again
// every few seconds until that rerun comes; if the stream cannot be read (an HTTP error, a stream
// that never opened, or three broken connections in a row) it triggers "failed: why" and the page
// follows the order with reruns instead.

const FEED_FAILURES = 3;
const DONE_RETRY_MS = 3000;

function follow(scene, feed) {
  const url = feed ? feed.url : null;
  // Already following this order (or nothing), or gave up on it: the rerun that the "failed"
  // trigger starts still names the feed until the page has switched to ticks.
  if (url === scene.feedUrl || url === scene.feedFailed) return;
  stopFollowing(scene);
  scene.feedUrl = url;
  if (!url) return;
  let failures = 0, heard = false;
  const source = new EventSource(url);
  scene.feedSource = source;
  source.onmessage = (message) => {
    if (scene.feedUrl !== url) return source.close(); // an older order's stream
    if (!scene.root.isConnected) return stopFollowing(scene); // the page moved on
    failures = 0;
    heard = true;
    const d = JSON.parse(message.data);
    if (d.error) return giveUp(scene, url, d.error);
    if (!d.done) return receive(scene, d);
    source.close();
    const sayDone = () => {
      if (scene.feedUrl !== url || !scene.root.isConnected) return;
      scene.say("feed", "done"); // the page's rerun draws the engine's final numbers
      scene.feedTimer = setTimeout(sayDone, DONE_RETRY_MS); // and if it never comes (a dropped connection), again
    };
    sayDone();
  };
  source.onerror = () => {
    if (scene.feedUrl !== url) return;
    // An HTTP error closes the source; a stream that never opened (a proxy that blocks it, say) is
    // not waited for; a dropped one is reopened by the browser, up to FEED_FAILURES times in a row.
    if (source.readyState === EventSource.CLOSED) return giveUp(scene, url, "the kitchen refused the live feed");
    if (!heard) return giveUp(scene, url, "the live feed could not be opened");
    if (++failures >= FEED_FAILURES) giveUp(scene, url, "the live feed's connection kept dropping");
  };
}

function stopFollowing(scene) {
  if (scene.feedSource) scene.feedSource.close();
  scene.feedSource = null;
  clearTimeout(scene.feedTimer);
}

function giveUp(scene, url, why) {
  stopFollowing(scene);
  scene.feedUrl = null;
  scene.feedFailed = url;
  scene.say("feed", `failed: ${why}`);
}

function mount(parent) {
  const root = document.createElement("div");
  root.className = "tpk-root";
  root.innerHTML = `
    <div class="tpk-live-panels" hidden>${PANELS}</div>
    <div class="tpk-class-rail" hidden></div>
    <div class="tpk-scene">${SVG}</div>
    <aside class="tpk-side">
      <div class="tpk-side-head">
        <span class="tpk-side-title">Bowls served (generated text)</span>
        <button class="tpk-replay" type="button" hidden>↺ Replay</button>
      </div>
      <div class="tpk-texts"></div>
      <p class="tpk-more"></p>
    </aside>`;
  parent.appendChild(root);
  const $ = (sel) => root.querySelector(sel);
  const scene = {
    root, $,
    svg: $("svg"),
    reduced: window.matchMedia("(prefers-reduced-motion: reduce)").matches,
    data: null, runId: null, playStart: null, slow: null, raf: null, drawn: null,
    feedUrl: null, feedSource: null, feedTimer: null, feedFailed: null, say: null, tick: null, seen: null,
    panels: $(".tpk-live-panels"), panelsKey: null,
    classRail: $(".tpk-class-rail"), classRailHtml: null,
  };
  $(".tpk-replay").addEventListener("click", () => restart(scene));
  return scene;
}

// ---------------------------------------------------------------- receiving measured data

function receive(scene, data) {
  drawPanels(scene, data.panels ?? null);
  drawClassRail(scene, data.class_rail ?? null);
  scene.root.classList.toggle("tpk-presenter", !!data.presenter);
  if (data.run_id !== scene.runId) {
    scene.runId = data.run_id;
    scene.data = data;
    scene.playStart = null;
    scene.slow = null;
    buildOrders(scene, data);
  }
  scene.data = data;
  const cooking = data.t_done === null;
  scene.root.classList.toggle("tpk-still", cooking);
  if (cooking) {
    const key = stillKey(data);
    if (key !== scene.stillKey) drawStill(scene); // an update with nothing new measured draws nothing
    scene.stillKey = key;
    tickDuringPrefill(scene, data);
    return;
  }
  tickDuringPrefill(scene, null);
  scene.stillKey = null;
  if (scene.playStart === null) {
    scene.slow = data.slowdown || 1; // fixed for the whole run: the wok and the pot keep their true ratio
    buildOrders(scene, data); // the replay starts from an empty kitchen
    scene.playStart = performance.now();
  }
  if (scene.raf === null) scene.raf = requestAnimationFrame((now) => frame(scene, now));
}

// A long prefill reports nothing until its pass ends (one forward pass, one event), so a still
// frame would freeze for seconds. While the wok's pass is open, the clock and the wok's timer tick
// on the browser's own clock from the moment this page learned the pass had started: "at least
// this long so far", which the pass's measured time replaces as soon as it arrives. One text node
// or two, four times a second, only during prefill.
function tickDuringPrefill(scene, d) {
  const open = d && d.prefill && d.prefill[1] === null && !d.quiet;
  if (!open) {
    clearInterval(scene.tick);
    scene.tick = null;
    scene.seen = null;
    return;
  }
  if (!scene.seen || scene.seen.run !== d.run_id) scene.seen = { run: d.run_id, at: performance.now(), t: d.prefill[0] };
  if (scene.tick !== null) return;
  const show = () => {
    if (!scene.root.isConnected) return tickDuringPrefill(scene, null);
    const t = scene.seen.t + (performance.now() - scene.seen.at) / 1000;
    setText(scene.$("#tpk-clock"), `LIVE · wok on for ≥ ${fmtTime(t)} (browser clock)`);
    setText(scene.$("#tpk-wok-timer"), `≥ ${fmtTime(t)}`);
  };
  show();
  scene.tick = setInterval(show, TICK_MS);
}

// What a still frame shows depends only on these: the same key, the same picture.
function stillKey(d) {
  return [d.run_id, d.presenter, d.prefill, d.steps.length, d.tokens.map((t) => t.length), d.kv_handed].join("|");
}

// While the engine cooks: the kitchen at the latest measured moment, drawn once per update.
function drawStill(scene) {
  if (scene.raf !== null) cancelAnimationFrame(scene.raf);
  scene.raf = null;
  const d = scene.data;
  draw(scene, d, horizon(d), 0);
  scene.$(".tpk-replay").hidden = true;
}

function restart(scene) {
  buildOrders(scene, scene.data);
  scene.lastDraw = 0;
  scene.playStart = performance.now();
  if (scene.raf === null) scene.raf = requestAnimationFrame((now) => frame(scene, now));
}

// The latest engine time the data covers: playback never runs past what was measured.
function horizon(d) {
  if (d.t_done !== null) return d.t_done;
  let h = d.prefill ? (d.prefill[1] ?? d.prefill[0]) : 0;
  if (d.steps.length) h = Math.max(h, d.steps[d.steps.length - 1][1]);
  if (d.restarts && d.restarts.length) h = Math.max(h, d.restarts[d.restarts.length - 1][0]); // the restart is news too
  return h;
}

function frame(scene, now) {
  scene.raf = null;
  if (!scene.root.isConnected) return; // the page moved on: stop drawing
  // ~25 frames a second is smooth for a kitchen and leaves the CPU to the engine being measured.
  if (scene.lastDraw && now - scene.lastDraw < FRAME_MS) {
    scene.raf = requestAnimationFrame((n) => frame(scene, n));
    return;
  }
  scene.lastDraw = now;
  const d = scene.data;
  let T = 0;
  if (scene.playStart !== null) {
    T = (now - scene.playStart) / 1000 / scene.slow;
    const h = horizon(d);
    if (T > h) {
      T = h;
      scene.playStart = now - h * scene.slow * 1000; // hold the clock until more events arrive
    }
  }
  draw(scene, d, T, now / 1000);
  const finished = d.t_done !== null && T >= d.t_done;
  scene.$(".tpk-replay").hidden = !finished;
  if (!finished) scene.raf = requestAnimationFrame((n) => frame(scene, n));
}

// ---------------------------------------------------------------- the live panels

// While an order cooks in the live view, the two panels (kitchen_viz/live_panels.py) are drawn
// here, in a fixed-height box above the kitchen: one component updated per fragment tick instead
// of two (measured: each live element's update at a tick cost the engine's core time on a 2-core
// machine, docs/benchmarks/ui-overhead.md). Built once per mount; an update changes the text of a
// few nodes and one polyline, and nothing animates. Without `panels` the box is hidden (the page
// draws the ordinary Streamlit panels then).
const PW = 300;
const PH = 56;
const PANELS = `
    <section class="tpk-lp tpk-lp-wok">
      <div class="tpk-lp-title">The wok · prefill</div>
      <div class="tpk-lp-row">
        <div class="tpk-lp-metric"><div class="tpk-lp-label" data-k="ttft_label">TTFT</div><div class="tpk-lp-value" data-k="ttft">—</div></div>
        <div class="tpk-lp-metric"><div class="tpk-lp-label">E2E</div><div class="tpk-lp-value" data-k="e2e">—</div></div>
      </div>
      <div class="tpk-lp-note" data-k="wok"></div>
      <div class="tpk-lp-note" data-k="wait"></div>
    </section>
    <section class="tpk-lp tpk-lp-pot">
      <div class="tpk-lp-title">The soup pot · decode <span class="tpk-lp-live">LIVE</span></div>
      <div class="tpk-lp-row">
        <div class="tpk-lp-metric"><div class="tpk-lp-label">TPOT (so far)</div><div class="tpk-lp-value" data-k="tpot">—</div></div>
        <div class="tpk-lp-metric"><div class="tpk-lp-label">Tokens/s, all tables (so far)</div><div class="tpk-lp-value" data-k="tps">—</div></div>
        <div class="tpk-lp-spark">
          <div class="tpk-lp-label">ITL per decode step (ms) · latest <span data-k="latest_itl">—</span></div>
          <svg viewBox="0 0 ${PW} ${PH}" preserveAspectRatio="none" class="tpk-lp-svg" aria-label="ITL of every decode step so far">
            <polyline class="tpk-lp-line" points=""/>
          </svg>
          <div class="tpk-lp-axis" data-k="axis"></div>
        </div>
      </div>
    </section>`;

function drawPanels(scene, p) {
  const box = scene.panels;
  if (box.hidden !== !p) box.hidden = !p;
  const key = p ? JSON.stringify(p) : null;
  if (!p || key === scene.panelsKey) { // nothing new measured: touch nothing
    scene.panelsKey = key;
    return;
  }
  scene.panelsKey = key;
  for (const el of box.querySelectorAll("[data-k]")) {
    const k = el.dataset.k;
    if (k in p) setText(el, String(p[k]));
  }
  const ms = slowestPer(p.itl_ms || [], SPARK_POINTS);
  const top = Math.max(...ms, 1e-9);
  const n = Math.max(ms.length - 1, 1);
  const pts = ms.map((v, i) => `${((i / n) * PW).toFixed(1)},${(PH - 2 - (v / top) * (PH - 6)).toFixed(1)}`).join(" ");
  setAttr(box.querySelector(".tpk-lp-line"), "points", pts);
  setText(box.querySelector('[data-k="axis"]'),
    ms.length ? `${p.steps} step${p.steps === 1 ? "" : "s"} · slowest ${top.toFixed(2)} ms` : "the pot has not started ladling yet");
}

// At most `k` values: consecutive stretches of `xs`, each drawn as its slowest (a spike stays visible).
function slowestPer(xs, k) {
  if (xs.length <= k) return xs;
  const out = [];
  for (let i = 0; i < k; i++) {
    const a = Math.floor((i * xs.length) / k), b = Math.floor(((i + 1) * xs.length) / k);
    out.push(Math.max(...xs.slice(a, b)));
  }
  return out;
}

// ---------------------------------------------------------------- the whole class (a class kitchen)

// On a class kitchen the order shares the pot with other students' orders: the page's feed sends
// the class board's rail (kitchen_viz/class_rail.py `rail_html`: tickets only, numbers and sizes,
// built by the server from its own board, never a prompt), redrawn only when it changed.
function drawClassRail(scene, html) {
  const box = scene.classRail;
  if (box.hidden !== !html) box.hidden = !html;
  if (!html || html === scene.classRailHtml) return;
  scene.classRailHtml = html;
  box.innerHTML = html;
}

// ---------------------------------------------------------------- the static parts of one order

function buildOrders(scene, d) {
  const { $ } = scene;
  const rail = $("#tpk-rail");
  const tables = $("#tpk-tables");
  rail.replaceChildren();
  tables.replaceChildren();
  const n = d.shown_tables;
  const compact = n > PER_ROW;
  const perRow = Math.min(n, PER_ROW);
  const x0 = 600 - (perRow * TABLE_W) / 2;
  const tw = compact ? 1120 / n : TABLE_W; // tickets: one rail, narrower when there are more of them
  const tx0 = 600 - (n * tw) / 2;
  for (let i = 0; i < n; i++) {
    const tx = tx0 + i * tw;
    if (compact) { // a stub per table: its number and prompt length, a tick mark once served
      const w = tw - 6;
      rail.appendChild(svgEl("g", { class: "tpk-ticket tpk-stub", transform: `translate(${tx + 3} 22)` }, `
        <rect x="0" y="0" width="${w}" height="74" rx="3" class="tpk-paper"/>
        <rect x="0" y="0" width="${w}" height="8" class="tpk-ticket-band"/>
        <text x="${w / 2}" y="30" class="tpk-ticket-title">${i + 1}</text>
        <text x="${w / 2}" y="55" class="tpk-ticket-sub">${d.prompt_tokens[i]}</text>
        <path d="M${w / 2 - 8} 62 l6 7 l11 -13" class="tpk-stamp tpk-tick" opacity="0"/>`));
    } else {
      rail.appendChild(svgEl("g", { class: "tpk-ticket", transform: `translate(${tx + 14} 22)` }, `
        <path d="M0 0 H112 V84 l-8 6 l-8 -6 l-8 6 l-8 -6 l-8 6 l-8 -6 l-8 6 l-8 -6 l-8 6 l-8 -6 l-8 6 l-8 -6 l-8 6 l-8 -6 l-8 6 Z" class="tpk-paper"/>
        <rect x="0" y="0" width="112" height="10" class="tpk-ticket-band"/>
        <text x="56" y="32" class="tpk-ticket-title">Table ${i + 1}</text>
        <text x="56" y="57" class="tpk-ticket-sub">${d.prompt_tokens[i]} tokens</text>
        <text x="56" y="80" class="tpk-stamp" transform="rotate(-3 56 80)" opacity="0">SERVED</text>`));
    }
    const rows = compact ? COMPACT_BOWL_ROWS : BOWL_ROWS;
    const x = x0 + (i % PER_ROW) * TABLE_W;
    const y = 490 + Math.floor(i / PER_ROW) * (rows * 18 + 52);
    tables.appendChild(svgEl("g", { class: "tpk-table", transform: `translate(${x} ${y})`, "data-rows": rows }, `
      <text x="${TABLE_W / 2}" y="16" class="tpk-table-name">Table ${i + 1}</text>
      <rect x="6" y="22" width="${TABLE_W - 12}" height="${rows * 18 + 8}" rx="10" class="tpk-tabletop"/>
      <g class="tpk-bowls"></g>
      <text x="${TABLE_W / 2}" y="${rows * 18 + 46}" class="tpk-bowl-count">0 bowls</text>`));
  }
  const texts = $(".tpk-texts");
  texts.replaceChildren();
  for (let i = 0; i < n; i++) {
    const p = document.createElement("p");
    p.className = "tpk-text";
    p.innerHTML = `<b>Table ${i + 1}</b> <span></span>`;
    texts.appendChild(p);
  }
  const hidden = d.batch - n;
  $(".tpk-more").textContent = hidden > 0
    ? `+ ${hidden} more tables cooked in the same passes (measured and counted in the kitchen's total, not drawn one by one).` : "";
  scene.drawn = { bowls: new Array(n).fill(0), served: new Array(n).fill(false), all: null };
}

// ---------------------------------------------------------------- drawing the kitchen at time T

function draw(scene, d, T, wall) {
  const pre = d.prefill;
  // While the engine cooks, the kitchen is drawn as it is right now (a still frame per update);
  // "live" here means the wok's pass has started but its end is not measured yet.
  const still = scene.playStart === null;
  const live = still && pre !== null && pre[1] === null;
  const cooking = live || (pre && T >= pre[0] && (pre[1] === null || T < pre[1]));
  scene.calm = scene.reduced || still; // no decorative motion in a still frame
  const prefilled = pre && pre[1] !== null && T >= pre[1];
  const stepsDone = countUntil(d.steps, T, 1);
  const done = d.t_done !== null && T >= d.t_done;
  const decoding = prefilled && !done;

  drawClock(scene, d, T, cooking, decoding, done, live);
  drawWok(scene, d, T, cooking, prefilled, wall, live);
  drawCounter(scene, d, T, prefilled, stepsDone, done);
  drawPot(scene, d, T, decoding, stepsDone, wall, done);
  drawTables(scene, d, T, cooking);
  drawAllTables(scene, d, T);
}

// The engine process restarted under the order (a crash, or stopped as hung): the last restart at or
// before T, and whether the fresh process has yet to ladle (its first pass recomputes the KV cache).
function restartBy(d, T) {
  const r = (d.restarts || []).filter((x) => x[0] <= T).pop();
  if (!r) return null;
  const back = d.steps.find((s) => s[1] > r[0]);
  return { t: r[0], kept: r[1], waiting: !back || T < back[1] };
}

function drawClock(scene, d, T, cooking, decoding, done, live) {
  const { $ } = scene;
  const r = restartBy(d, T);
  const phase = d.quiet && !d.prefill ? "Quiet view: the order is cooking unwatched"
    : r && r.waiting && !done ? `RESTART · a fresh engine goes on from ${fmtInt(r.kept)} tokens`
    : !d.prefill ? "Order going to the kitchen…"
    : live ? (d.wok_live ? `PREFILL · ${d.wok_live}` : "PREFILL · the wok is on right now")
    : cooking && d.tosses && d.tosses.length > 1
      ? `PREFILL · toss ${Math.max(1, d.tosses.filter((x) => x[0] <= T).length)} of ${d.tosses.length}: ${d.wok_why}`
    : cooking ? "PREFILL · the wok tosses every prompt token at once"
    : decoding ? "DECODE · the soup pot ladles one token per table per step"
    : done ? `Every table served · E2E ${fmtTime(d.e2e ?? d.t_done)}` : "The order is at the stove";
  setText($("#tpk-phase"), phase);
  const speed = d.slowdown_label ? ` · ${d.slowdown_label}` : "";
  setText($("#tpk-clock"), scene.playStart === null
    ? (d.quiet ? "the kitchen replays it when it is done"
      : d.prefill ? `LIVE · ${fmtTime(T)} measured so far` : "waiting for the first measurements…")
    : `engine clock ${fmtTime(T)}${speed}${r ? ` · restarted at ${fmtTime(r.t)}` : ""}`);
}

function drawWok(scene, d, T, cooking, prefilled, wall, live) {
  const { $ } = scene;
  const pre = d.prefill;
  const total = d.prompt_tokens.reduce((a, b) => a + b, 0);
  setStyle($("#tpk-wok-flames"), "opacity", cooking ? 1 : 0);
  $("#tpk-wok-flames").classList.toggle("tpk-anim", cooking && !scene.calm);
  // The wok fills in proportion to prompt tokens × tables (its capacity: the largest order the
  // controls allow), from the moment the order goes in; after prefill its heat is in the cache.
  const frac = Math.min(1, total / d.wok_capacity);
  const h = pre && (T >= pre[0] || live) ? Math.max(6, frac * 56) : 0;
  const fill = $("#tpk-wok-fill");
  setAttr(fill, "y", 374 - h);
  setAttr(fill, "height", h);
  setStyle(fill, "opacity", prefilled ? 0.45 : 1);
  drawBits(scene, cooking, total, frac, wall);
  setText($("#tpk-wok-load"), d.batch ? loadWords(d, total) : "");
  if (live) {
    setText($("#tpk-wok-rate"), "");
    setText($("#tpk-wok-note"), d.wok_live || "cooking now: the pass is being measured");
  }
  if (!pre || live) return;
  const burn = (pre[1] === null || T < pre[1]) ? Math.max(0, T - pre[0]) : pre[1] - pre[0];
  // Once the pass is over its time is labelled "pass": TTFT (the panels) adds setup and the 1st token.
  const passes = d.tosses && d.tosses.length > 1 ? `${d.tosses.length} tosses` : "pass";
  setText($("#tpk-wok-timer"), T < pre[0] ? "—" : prefilled ? `${passes} ${fmtTime(burn)}` : fmtTime(burn));
  // The wok's rate counts only the tokens its pass computed (d.wok_rate: the engine's prefill rate);
  // leftovers taken from the prefix cache are named, never counted as cooked.
  // Several tosses: the order's own prompt tokens (the passes also carried the pot's bowls).
  const cooked = d.tosses && d.tosses.length > 1 ? d.tosses.reduce((a, x) => a + x[2], 0)
    : d.wok_tokens || Math.max(0, total - (d.reused || 0));
  setText($("#tpk-wok-rate"), prefilled ? (d.wok_rate || fmtRate(cooked / (pre[1] - pre[0]))) : "");
  setText($("#tpk-wok-note"), prefilled
    ? (d.reused ? `${fmtInt(d.reused)} of ${fmtInt(total)} prompt tokens reused`
      : d.tosses && d.tosses.length > 1 ? `${fmtInt(cooked)} tokens cooked in ${d.tosses.length} tosses`
      : `${fmtInt(cooked)} tokens cooked in the pass`)
    : cooking && d.tosses && d.tosses.length > 1 ? d.wok_why
    : cooking ? "high flame: all tables' tokens in one pass" : "the order is on the rail");
}

// "28,672 prompt tokens (64 tables × 448)": the total, then what it is made of.
function loadWords(d, total) {
  const same = d.prompt_tokens.every((x) => x === d.prompt_tokens[0]);
  const tables = `${fmtInt(d.batch)} table${d.batch > 1 ? "s" : ""}`;
  const parts = d.batch === 1 ? "1 table" : same ? `${tables} × ${fmtInt(d.prompt_tokens[0])}` : tables;
  const pad = d.slots > total ? ` + ${fmtInt(d.slots - total)} padding` : "";
  return `${fmtInt(total)} prompt tokens (${parts})${pad}`;
}

// Ingredients tossed in the wok: one bit per token (up to 40), flying while the flame is high.
function drawBits(scene, cooking, total, frac, wall) {
  const g = scene.$("#tpk-wok-bits");
  const want = cooking ? Math.min(40, Math.max(4, total)) : 0;
  while (g.childElementCount < want) g.appendChild(svgEl("circle", { r: 5, class: "tpk-bit" }));
  while (g.childElementCount > want) g.lastChild.remove();
  const surface = 374 - Math.max(6, frac * 56);
  [...g.children].forEach((c, i) => {
    const x = 150 + ((i * 37) % 200);
    const toss = scene.calm ? 0 : Math.max(0, Math.sin(wall * 7 + i * 1.7)) * (30 + (i % 5) * 10);
    setAttr(c, "cx", x + (scene.calm ? 0 : Math.sin(wall * 3 + i) * 6));
    setAttr(c, "cy", surface - 4 - toss);
  });
}

function drawCounter(scene, d, T, prefilled, stepsDone, done) {
  const { $ } = scene;
  const pre = d.prefill;
  setStyle($("#tpk-kv-group"), "opacity", prefilled ? 1 : 0);
  if (!prefilled) {
    setText($("#tpk-kv-mb"), "empty");
    setText($("#tpk-kv-tokens"), "");
    setText($("#tpk-kv-note"), "the KV cache waits here");
    setText($("#tpk-handover"), "");
    return;
  }
  // Slide from the wok to the counter over 0.4 s of *screen* time: the handover, not a restart.
  // A finished order (a one-token order ends right after its prefill) shows it arrived.
  const screenS = (T - pre[1]) * (scene.slow || 1);
  const slide = scene.calm || done ? 1 : easeOut(Math.min(1, screenS / 0.4));
  setAttr($("#tpk-kv-group"), "transform", `translate(${-350 * (1 - slide)} ${-30 * (1 - slide)})`);
  const kv = stepsDone ? d.steps[stepsDone - 1][2] : d.kv_handed;
  const last = d.steps.length ? d.steps[d.steps.length - 1][2] : d.kv_handed;
  const peak = Math.max(last, d.kv_handed, 1);
  setAttr($("#tpk-kv-level"), "width", (152 * kv) / peak);
  const perTok = d.kv_bytes_per_token;
  setText($("#tpk-kv-mb"), fmtBytes(kv));
  setText($("#tpk-kv-tokens"), perTok ? `${fmtInt(Math.round(kv / perTok))} tokens` : "");
  setText($("#tpk-kv-note"), stepsDone ? "+1 token per table per step"
    : d.steps.length || !done ? "handed over from the wok" : "no decode step needed it");
  if (d.steps.length) {
    const gap = d.steps[0][0] - pre[1];
    setText($("#tpk-handover"), `no cold restart: decode began ${fmtTime(gap)} after prefill, on this cache`);
  }
}

function drawPot(scene, d, T, decoding, stepsDone, wall, done) {
  const { $ } = scene;
  const ladling = decoding && d.steps.length > 0 && d.t_first !== null && T >= d.t_first;
  const flames = $("#tpk-pot-flames");
  setStyle(flames, "opacity", ladling ? 1 : 0.25);
  flames.classList.toggle("tpk-anim", ladling && !scene.calm);
  setStyle($("#tpk-steam"), "opacity", ladling || stepsDone ? 0.7 : 0);
  $("#tpk-steam").classList.toggle("tpk-anim", ladling && !scene.calm);
  // The ladle dips once per measured decode step: its swing is the step's own progress.
  let swing = 0;
  if (ladling && !scene.calm) {
    const prev = stepsDone ? d.steps[stepsDone - 1][1] : d.t_first;
    const next = stepsDone < d.steps.length ? d.steps[stepsDone][1] : null;
    const p = next ? Math.min(1, (T - prev) / Math.max(1e-9, next - prev)) : 0;
    swing = Math.sin(Math.PI * p);
  }
  setAttr($("#tpk-ladle"), "transform", `translate(${1000 - 24 * swing} ${300 + 8 * swing}) rotate(${75 - 70 * swing})`);
  if (d.t_first === null || T < d.t_first) {
    setText($("#tpk-pot-timer"), "—");
    setText($("#tpk-pot-rate"), "");
    setText($("#tpk-pot-note"), "one bowl per table per step");
    return;
  }
  if (stepsDone) {
    const prevEnd = stepsDone > 1 ? d.steps[stepsDone - 2][1] : d.t_first;
    const itl = d.steps[stepsDone - 1][1] - prevEnd;
    const served = d.served || [];
    const bowls = stepsDone < served.length ? served[stepsDone][1] - served[stepsDone - 1][1] : d.batch;
    const sum = d.summary;
    if (done && sum) {
      // The last frame shows the panels' own figures (the engine's metrics), labelled as the mean.
      setText($("#tpk-pot-timer"), `TPOT ${sum.tpot}`);
      setText($("#tpk-pot-rate"), sum.tps);
      setText($("#tpk-pot-note"), `mean of ${fmtInt(sum.steps)} decode step${sum.steps === 1 ? "" : "s"}`);
    } else {
      setText($("#tpk-pot-timer"), `${fmtTime(itl)} this step`);
      setText($("#tpk-pot-rate"), fmtRate(bowls / itl));
      const of = d.t_done !== null ? ` of ${fmtInt(d.steps.length)}` : "";
      setText($("#tpk-pot-note"), `this step: ${fmtInt(stepsDone)}${of} · ${fmtInt(bowls)} bowl${bowls === 1 ? "" : "s"}`);
    }
  } else {
    // The first token of every table was sampled from the wok's logits: the pot has not ladled yet.
    setText($("#tpk-pot-timer"), "—");
    setText($("#tpk-pot-rate"), "");
    setText($("#tpk-pot-note"), done && !d.steps.length ? "no decode step: 1 token, from the wok"
      : "1st bowls came from the wok");
  }
}

function drawTables(scene, d, T, cooking) {
  const { $ } = scene;
  const tables = $("#tpk-tables").children;
  const texts = $(".tpk-texts").children;
  const tickets = $("#tpk-rail").children;
  for (let i = 0; i < d.shown_tables; i++) {
    const toks = d.tokens[i] || [];
    const n = countUntil(toks, T, 0);
    tickets[i].classList.toggle("tpk-in-wok", !!cooking);
    if (n !== scene.drawn.bowls[i]) {
      drawBowls(tables[i], n, Number(tables[i].dataset.rows || BOWL_ROWS));
      setText(tables[i].querySelector(".tpk-bowl-count"), `${fmtInt(n)} bowl${n === 1 ? "" : "s"}`);
      // While the engine cooks, only the text's tail: the paragraph's layout stays the same size at
      // every update instead of growing with the answer (the browser shares the engine's cores).
      const span = texts[i].querySelector("span");
      const from = scene.playStart === null ? Math.max(0, n - LIVE_TEXT_TOKENS) : 0;
      span.textContent = (from ? "…" : "") + toks.slice(from, n).map((t) => t[1]).join("");
      scene.drawn.bowls[i] = n;
    }
    const served = d.t_done !== null && T >= d.t_done;
    if (served !== scene.drawn.served[i]) {
      setAttr(tickets[i].querySelector(".tpk-stamp"), "opacity", served ? 1 : 0);
      scene.drawn.served[i] = served;
    }
  }
}

// Bowls line up six to a row, `rows` rows at most; the count under the table is always the full one.
function drawBowls(table, n, rows) {
  const g = table.querySelector(".tpk-bowls");
  const cap = BOWLS_PER_ROW * rows;
  const shown = Math.min(n, cap);
  while (g.childElementCount > shown) g.lastChild.remove();
  while (g.childElementCount < shown) {
    const j = g.childElementCount;
    const x = 11 + (j % BOWLS_PER_ROW) * 20;
    const y = 27 + Math.floor(j / BOWLS_PER_ROW) * 18;
    g.appendChild(svgEl("use", { href: "#tpk-bowl", x, y, width: 19, height: 13, class: "tpk-new-bowl" }));
  }
}

// Every table, drawn or not: the bowls served so far over all of them (measured per step).
function drawAllTables(scene, d, T) {
  const served = d.served || [];
  const k = countUntil(served, T, 0);
  const bowls = k ? served[k - 1][1] : 0;
  const drawn = d.batch > d.shown_tables ? ` · ${d.shown_tables} drawn, ${fmtInt(d.batch - d.shown_tables)} counted` : "";
  const words = d.batch ? `All ${fmtInt(d.batch)} table${d.batch > 1 ? "s" : ""}: ${fmtInt(bowls)} bowl${bowls === 1 ? "" : "s"} served${drawn}` : "";
  setText(scene.$("#tpk-all-tables"), words);
}

// ---------------------------------------------------------------- small helpers

// How many items (sorted by their time at index k) happened at or before T.
function countUntil(items, T, k) {
  let lo = 0, hi = items.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (items[mid][k] <= T) lo = mid + 1; else hi = mid;
  }
  return lo;
}

function svgEl(tag, attrs, inner) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (inner) el.innerHTML = inner;
  return el;
}

function setText(el, s) {
  if (el && el.textContent !== s) el.textContent = s;
}

// Attributes and styles are written only when they change: a write of the same value still makes
// Chromium restyle and repaint the element, and while the engine cooks that is CPU taken from it.
function setAttr(el, name, value) {
  const s = String(value);
  if (el.getAttribute(name) !== s) el.setAttribute(name, s);
}

function setStyle(el, prop, value) {
  const s = String(value);
  if (el.style[prop] !== s) el.style[prop] = s;
}

const easeOut = (x) => 1 - (1 - x) * (1 - x) * (1 - x);
const fmtInt = (n) => n.toLocaleString("en-US");

// The same rule as kitchen_viz/units.py fmt_s, so a time reads the same in the drawing and the panels.
function fmtTime(s) {
  if (s < 0.1) return `${(s * 1e3).toFixed(2)} ms`;
  if (s < 1) return `${(s * 1e3).toFixed(1)} ms`;
  return `${s.toFixed(2)} s`;
}

function fmtBytes(b) {
  if (b >= 1e9) return `${(b / 1e9).toFixed(2)} GB`;
  if (b >= 1e6) return `${(b / 1e6).toFixed(2)} MB`;
  return `${(b / 1e3).toFixed(1)} KB`;
}

// kitchen_viz/units.py fmt_tps's rule: whole tokens per second, with thousands separators.
function fmtRate(tps) {
  return `${fmtInt(Math.round(tps))} tok/s`;
}
