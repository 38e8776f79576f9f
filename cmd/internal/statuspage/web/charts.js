// fan's status page: the charts. Everything is drawn here as SVG from what
// api/history answers (the bus, read by the page server): nothing is
// loaded from elsewhere. Texts go in with textContent.
'use strict';

const SVGNS = 'http://www.w3.org/2000/svg';
const RANGES = [['24h', 24 * 3600e3], ['7d', 7 * 24 * 3600e3]];
const PALETTE = ['#1a7f37', '#0969da', '#bf8700', '#8250df', '#cf222e', '#1b7c83', '#953800', '#57606a'];
const ACTION_COLOR = { failover: '#cf222e', failback: '#1a7f37', switchover: '#8250df', place: '#57606a', retry: '#bf8700' };
let historyData = null;
let historyTimer = null;
let nodeOrder = {}; // "cluster/group" -> nodes by priority, from the last snapshot

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'data') for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = dv;
    else e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function tip(text) { return svg('title', {}, text); }

function ms(t) { return zero(t) ? 0 : new Date(t).getTime(); }

// colorOf gives each node of a group the color of its place in the
// group's order, so the preferred node is always green.
function colorOf(key, node) {
  let order = nodeOrder[key] || [];
  let i = order.indexOf(node);
  if (i < 0) {
    order = order.concat([node]);
    nodeOrder[key] = order;
    i = order.length - 1;
  }
  return PALETTE[i % PALETTE.length];
}

// onStatus is called by app.js with every snapshot.
function onStatus(snap) {
  for (const g of snap.groups) nodeOrder[g.cluster + '/' + g.status.group] = g.nodes.map((n) => n.name);
}

// scheduleHistory reads api/history again in a moment (a decision just
// arrived) or at the next regular refresh.
function scheduleHistory(delay) {
  if (historyTimer) clearTimeout(historyTimer);
  historyTimer = setTimeout(loadHistory, delay);
}

async function loadHistory() {
  historyTimer = null;
  let r;
  try {
    r = await fetch('api/history', { credentials: 'same-origin', cache: 'no-store' });
  } catch (e) {
    scheduleHistory(15000);
    return;
  }
  if (r.status === 401) return; // app.js shows the login
  if (r.ok) {
    historyData = await r.json();
    renderHistory(historyData);
  }
  scheduleHistory(15000);
}

function renderHistory(h) {
  renderStrips(h);
  renderFailovers(h);
  renderNodeCharts(h);
}

function widthOf(el) { return Math.max(260, Math.floor(el.clientWidth || 0)); }

function fmtShort(t) {
  const d = new Date(t);
  const p = (n) => String(n).padStart(2, '0');
  return `${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}`;
}

function renderStrips(h) {
  const box = $('history');
  const now = ms(h.now);
  const out = [];
  for (const g of h.groups) {
    const key = g.cluster + '/' + g.group;
    const wrap = el('div', { class: 'strips', data: { group: key } }, el('h3', {}, g.group + ' ', el('small', {}, g.cluster)));
    out.push(wrap);
    const legend = el('div', { class: 'legend' });
    const nodes = [...new Set([...(nodeOrder[key] || []), ...g.segments.map((s) => s.node)])];
    for (const n of nodes) legend.append(el('span', {}, el('i', { class: 'swatch', data: { color: colorOf(key, n) } }), n));
    for (const [a, c] of Object.entries(ACTION_COLOR)) legend.append(el('span', {}, el('i', { class: 'tick', data: { color: c } }), a));
    legend.append(el('span', {}, el('i', { class: 'pinmark' }), 'pinned'));
    for (const i of legend.querySelectorAll('[data-color]')) i.style.background = i.dataset.color;
    wrap.append(legend);
    const W = widthOf(box);
    for (const [label, span] of RANGES) {
      const t0 = now - span;
      const x = (t) => Math.max(0, Math.min(W, ((t - t0) / span) * W));
      const moves = g.moves.filter((m) => ms(m.at) > t0);
      const s = svg('svg', { class: 'strip', width: W, height: 46, viewBox: `0 0 ${W} 46`, role: 'img',
        'aria-label': `${g.group}: holders over the last ${label}, ${moves.length} moves`,
        data: { range: label, moves: moves.length, group: key } });
      s.append(svg('rect', { x: 0, y: 8, width: W, height: 22, class: 'none' }, tip('no holder known')));
      for (const seg of g.segments) {
        const from = ms(seg.from), to = seg.to ? ms(seg.to) : now;
        if (to <= t0) continue;
        const x0 = x(from), x1 = x(to);
        s.append(svg('rect', { x: x0, y: 8, width: Math.max(1, x1 - x0), height: 22, fill: colorOf(key, seg.node), class: 'seg',
          data: { node: seg.node } }, tip(`${seg.node} held ${g.group} from ${fmtTime(seg.from)}` + (seg.to ? ` to ${fmtTime(seg.to)}` : ', holds it now'))));
      }
      for (const p of g.pins) {
        const from = ms(p.from), to = p.to ? ms(p.to) : now;
        if (to <= t0) continue;
        const x0 = x(from), x1 = x(to);
        s.append(svg('rect', { x: x0, y: 2, width: Math.max(2, x1 - x0), height: 5, class: 'pin', data: { id: p.id } },
          tip(`pinned to ${p.node} by ${p.operator} from ${fmtTime(p.from)}` + (p.to ? ` to ${fmtTime(p.to)} (${p.end})` : ', in force'))));
      }
      for (const m of moves) {
        const mx = x(ms(m.at));
        const g2 = svg('g', { class: 'move', tabindex: 0, data: { id: m.id, action: m.action } },
          tip(`${fmtTime(m.at)} ${m.action.toUpperCase()} ${m.from || '(none)'}->${m.to}: ${m.reason}`),
          svg('rect', { x: mx - 1, y: 4, width: 2, height: 30, fill: ACTION_COLOR[m.action] || '#57606a' }),
          svg('rect', { x: mx - 7, y: 0, width: 14, height: 36, class: 'hit' }));
        const open = () => explain(m.id, g2);
        g2.addEventListener('click', open);
        g2.addEventListener('keydown', (e) => { if (e.key === 'Enter') open(); });
        s.append(g2);
      }
      // Ticks: every 6 hours over a day, every day over a week.
      const step = label === '24h' ? 6 * 3600e3 : 24 * 3600e3;
      const first = Math.ceil(t0 / step) * step;
      for (let t = first; t <= now; t += step) {
        const tx = x(t);
        s.append(svg('rect', { x: tx, y: 30, width: 1, height: 4, class: 'axis' }));
        const d = new Date(t);
        const text = label === '24h' ? `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}`
          : d.toLocaleDateString(undefined, { weekday: 'short' });
        if (tx > 14 && tx < W - 14) s.append(svg('text', { x: tx, y: 44, class: 'axis', 'text-anchor': 'middle' }, text));
      }
      wrap.append(el('div', { class: 'strip-row' }, el('span', { class: 'range' }, label), s));
    }
  }
  box.replaceChildren(...(out.length ? out : [el('p', { class: 'muted' }, 'nothing in the trail of the last 7 days yet')]));
}

function renderFailovers(h) {
  const box = $('failovers');
  const rows = [];
  for (const g of h.groups) for (const f of g.failovers) rows.push([g, f]);
  rows.sort((a, b) => ms(b[1].at) - ms(a[1].at));
  const shown = rows.slice(0, 12);
  if (!shown.length) {
    box.replaceChildren(el('p', { class: 'muted' }, 'no failover in the last 7 days'));
    return;
  }
  const W = widthOf(box);
  const labelW = Math.min(190, Math.floor(W * 0.38)), valueW = 64;
  const barW = Math.max(60, W - labelW - valueW);
  const top = Math.max(100, ...shown.map(([, f]) => f.total_ms));
  const rowH = 22;
  const s = svg('svg', { class: 'failovers', width: W, height: shown.length * rowH + 4, viewBox: `0 0 ${W} ${shown.length * rowH + 4}`,
    role: 'img', 'aria-label': `${shown.length} failovers, fault to answered`, data: { count: shown.length } });
  shown.forEach(([g, f], i) => {
    const y = i * rowH + 2;
    const sc = (v) => (v / top) * barW;
    const parts = [['detect', f.detect_ms], ['decide', f.decide_ms], ['act', f.act_ms]];
    const grp = svg('g', { class: 'fo', tabindex: 0, data: { id: f.id, ms: Math.round(f.total_ms), group: g.group, answered: f.answered ? 'yes' : 'no' } },
      tip(`${g.group} ${f.from}->${f.to} at ${fmtTime(f.at)}: ${Math.round(f.total_ms)} ms from ` +
        (f.fault_known ? `the first failing probe (${fmtTime(f.fault)})` : 'the health transition (no failing probe read)') +
        ` to ${f.answered ? `${f.answered_by} on ${f.to} (${fmtTime(f.answered)})` : 'the decision (no result read yet)'}: ` +
        `detect ${Math.round(f.detect_ms)} ms, decide ${Math.round(f.decide_ms)} ms, act ${Math.round(f.act_ms)} ms`),
      svg('text', { x: 0, y: y + 14, class: 'label' }, `${fmtShort(f.at)} ${g.group} ${f.from}→${f.to}`));
    let x = labelW;
    for (const [name, v] of parts) {
      const w = sc(v);
      if (w > 0) grp.append(svg('rect', { x, y: y + 3, width: Math.max(1, w), height: 14, class: 'part ' + name }));
      x += w;
    }
    grp.append(svg('rect', { x: labelW, y: y + 3, width: Math.max(1, sc(f.total_ms)), height: 14, class: 'total' }));
    grp.append(svg('text', { x: W - 2, y: y + 14, class: 'value', 'text-anchor': 'end' }, `${Math.round(f.total_ms)} ms`));
    grp.append(svg('rect', { x: 0, y, width: W, height: rowH, class: 'hit' }));
    const open = () => explain(f.id, grp);
    grp.addEventListener('click', open);
    grp.addEventListener('keydown', (e) => { if (e.key === 'Enter') open(); });
    s.append(grp);
  });
  const legend = el('div', { class: 'legend' }, el('span', {}, el('i', { class: 'swatch detect' }), 'fault to verdict (probes)'),
    el('span', {}, el('i', { class: 'swatch decide' }), 'verdict to decision'), el('span', {}, el('i', { class: 'swatch act' }), 'decision to answered'));
  box.replaceChildren(legend, s);
}

// spark draws one small chart of a node's last hour.
function spark(points, pick, unit, cls, fixedTop) {
  const W = 150, H = 40;
  const vals = points.map((p) => pick(p)).filter((v) => v !== null && v !== undefined);
  const top = fixedTop || Math.max(1, ...vals);
  const s = svg('svg', { class: 'spark ' + cls, width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  s.append(svg('rect', { x: 0, y: 0, width: W, height: H - 12, class: 'bg' }));
  if (points.length > 1) {
    const t0 = ms(points[0].t), t1 = ms(points[points.length - 1].t) || t0 + 1;
    const pts = [];
    for (const p of points) {
      const v = pick(p);
      if (v === null || v === undefined) continue;
      const x = ((ms(p.t) - t0) / Math.max(1, t1 - t0)) * (W - 2) + 1;
      pts.push(`${x.toFixed(1)},${(H - 13 - (v / top) * (H - 16)).toFixed(1)}`);
    }
    if (pts.length) s.append(svg('polyline', { points: pts.join(' '), class: 'line' }));
  }
  return s;
}

function renderNodeCharts(h) {
  const box = $('node-charts');
  const cards = [];
  for (const n of h.nodes) {
    const last = n.last || {};
    const ch = last.channels === undefined || last.channels === null ? null : last.channels;
    const card = el('div', { class: 'node-card', data: { node: n.node, cluster: n.cluster, channels: ch === null ? '' : ch } },
      el('h3', {}, n.node + ' ', el('small', {}, 'heard ' + ago(n.last_seen))));
    const row = (name, text, chart) => el('div', { class: 'metric' }, el('span', { class: 'name' }, name),
      el('span', { class: 'now ' + name.replace(/\W/g, '') }, text), chart);
    card.append(row('channels', ch === null ? 'not reported' : `${ch} ch`, spark(n.points, (p) => p.channels, 'ch', 'channels')));
    card.append(row('CPU', `${(last.cpu || 0).toFixed(0)} %`, spark(n.points, (p) => p.cpu, '%', 'cpu', 100)));
    card.append(row('memory', `${(last.mem || 0).toFixed(0)} % used`, spark(n.points, (p) => p.mem, '%', 'mem', 100)));
    cards.push(card);
  }
  box.replaceChildren(...(cards.length ? cards : [el('p', { class: 'muted' }, 'no heartbeat in the last hour')]));
}

let resizeTimer = null;
window.addEventListener('resize', () => {
  if (resizeTimer) clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => { if (historyData) renderHistory(historyData); }, 150);
});
