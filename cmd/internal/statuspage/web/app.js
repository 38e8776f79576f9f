// fan's status page. Every URL is relative, so the page works under any
// path prefix and behind a reverse proxy; every text goes in with
// textContent, never as HTML.
'use strict';

const $ = (id) => document.getElementById(id);
let source = null;
let skew = 0; // server clock minus browser clock, from each snapshot
const seen = new Set();
let timelineMax = 500;
let selected = null;

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'data') for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = dv;
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function zero(t) { return !t || t.startsWith('0001-'); }

function fmtTime(t) {
  if (zero(t)) return '-';
  const d = new Date(t);
  const p = (n, w = 2) => String(n).padStart(w, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

function ago(t) {
  if (zero(t)) return 'never';
  let s = Math.round((Date.now() + skew - new Date(t).getTime()) / 1000);
  const neg = s < 0;
  s = Math.abs(s);
  let out;
  if (s < 60) out = `${s}s`;
  else if (s < 3600) out = `${Math.floor(s / 60)}m${s % 60}s`;
  else if (s < 86400) out = `${Math.floor(s / 3600)}h${Math.floor(s % 3600 / 60)}m`;
  else out = `${Math.floor(s / 86400)}d${Math.floor(s % 86400 / 3600)}h`;
  return neg ? `in ${out}` : `${out} ago`;
}

function health(h) { return el('span', { class: 'health-' + (h || 'unknown') }, h || 'unknown'); }

function showLogin(msg) {
  if (source) { source.close(); source = null; }
  $('app').hidden = true;
  $('logout').hidden = true;
  $('login-panel').hidden = false;
  $('login-error').textContent = msg || '';
  setConn(false, 'logged out');
  $('token').focus();
}

function setConn(on, text) {
  const c = $('conn');
  c.className = 'conn ' + (on ? 'on' : 'off');
  c.textContent = text;
}

function windowFor(plans, cluster, group) {
  for (const p of plans) {
    if (p.cluster !== cluster) continue;
    for (const g of p.groups || []) {
      if (g.group !== group) continue;
      if (g.open) return `${g.open.window}: open, closes ${ago(g.open.end).replace(/^in /, 'in ')} (${fmtTime(g.open.end)})`;
      if (g.windows && g.windows.length) return `${g.windows[0].window}: opens ${ago(g.windows[0].start)} (${fmtTime(g.windows[0].start)})`;
      return 'no window: never fails back automatically';
    }
  }
  return 'no plan published (no scheduler): never fails back automatically';
}

function renderStatus(snap) {
  if (snap.timeline_max) timelineMax = snap.timeline_max;
  skew = new Date(snap.now).getTime() - Date.now();
  $('clock').textContent = 'as of ' + fmtTime(snap.now);
  $('status-error').textContent = snap.error || '';
  const gb = $('groups').tBodies[0];
  const nb = $('nodes').tBodies[0];
  const gRows = [], nRows = [];
  for (const g of snap.groups) {
    const s = g.status;
    const key = g.cluster + '/' + s.group;
    const permit = zero(s.permit_until) ? 'none' : 'until ' + fmtTime(s.permit_until);
    // A pin shows beside the holder: who pinned the group there, until when.
    const pin = s.pin ? el('span', { class: 'badge pinned', title: `pinned to ${s.pin.node} by ${s.pin.operator}` +
      (s.pin.reason ? ` (${s.pin.reason})` : '') + ` since ${fmtTime(s.pin.since)}` },
    'pinned ' + (zero(s.pin.until) ? 'until cleared' : 'until ' + fmtTime(s.pin.until))) : null;
    gRows.push(el('tr', { data: { group: key } },
      el('td', {}, g.cluster), el('td', {}, s.group), el('td', {}, (s.addresses || []).join(', ')),
      el('td', { class: 'holder', data: { holder: s.holder || '' } }, s.holder || '(none)', pin ? ' ' : null, pin),
      el('td', { class: 'epoch' }, s.epoch), el('td', {}, fmtTime(s.since)),
      el('td', { class: 'permit' }, permit), el('td', {}, windowFor(snap.plans, g.cluster, s.group)),
      el('td', {}, ago(s.updated_at))));
    for (const n of g.nodes) {
      const checks = el('ul', { class: 'checks' });
      for (const c of n.checks) {
        checks.append(el('li', { data: { check: c.check } }, health(c.health),
          ` ${c.check} (${c.role}, by ${c.prober}) since ${fmtTime(c.since)}`));
      }
      const flags = [];
      if (n.standby) flags.push('standby');
      if (n.silent) flags.push('silent');
      nRows.push(el('tr', { data: { group: key, node: n.name } },
        el('td', {}, s.group), el('td', {}, n.name), el('td', {}, n.priority),
        el('td', { class: 'health' }, health(n.health)), el('td', {}, fmtTime(n.health_since)),
        el('td', {}, ago(n.last_heard)),
        el('td', {}, (n.eligible ? 'yes' : 'no') + (flags.length ? ' (' + flags.join(', ') + ')' : '')),
        el('td', {}, checks), el('td', { class: 'calls' }, callsCell(n))));
    }
  }
  gb.replaceChildren(...gRows);
  nb.replaceChildren(...nRows);
  // The operators' leaders holds, where nobody can miss them.
  const holds = snap.holds || [];
  $('holds').hidden = !holds.length;
  $('holds').replaceChildren(...holds.map((h) => el('p', { data: { operator: h.operator } },
    `LEADERS HELD ${h.server ? 'on ' + h.server : 'where they are'} by ${h.operator}` + (h.reason ? ` (${h.reason})` : '') +
    ` since ${fmtTime(h.since)} until ${fmtTime(h.until)} (${ago(h.until)}): the steward keeps no leader on its servers and a standby keeps the lease`)));
  if (typeof onStatus === 'function') onStatus(snap);
  $('notes').replaceChildren(...(snap.notes.length ? snap.notes.map((n) => el('li', {}, n))
    : [el('li', {}, 'nothing waiting')]));
}

// callsCell says what the holder's calls summary counts: the calls up and
// how many a move would carry across.
function callsCell(n) {
  const c = n.calls;
  if (!c) return '';
  const rest = [];
  if (c.anchored) rest.push(`${c.anchored} anchored`);
  if (c.incomplete) rest.push(`${c.incomplete} incomplete`);
  if (c.unrecorded) rest.push(`${c.unrecorded} unrecorded`);
  return `${c.calls} up, ${c.carriable} carriable` + (rest.length ? ', ' + rest.join(', ') : '') + ` (${ago(n.calls_at)})`;
}

function eventLine(ev) {
  let line = `${ev.type} ${ev.source} ${ev.summary}`;
  if (ev.epoch) line += ` epoch=${ev.epoch}`;
  return line;
}

function addEvent(ev) {
  if (seen.has(ev.id)) return;
  seen.add(ev.id);
  let cls = ev.decision ? 'decision' : '';
  if (ev.needs_human) cls += ' needs-human';
  const li = el('li', { class: cls, data: { id: ev.id, type: ev.type }, title: 'id ' + ev.id },
    el('span', { class: 'time' }, fmtTime(ev.time) + ' '), eventLine(ev));
  li.addEventListener('click', () => explain(ev.id, li));
  // A move changes the charts: read them again in a moment.
  if (ev.decision && typeof scheduleHistory === 'function') scheduleHistory(800);
  const list = $('timeline');
  list.prepend(li);
  while (list.children.length > timelineMax) {
    const last = list.lastElementChild;
    seen.delete(last.dataset.id);
    last.remove();
  }
}

async function explain(id, li) {
  if (selected) selected.classList.remove('selected');
  selected = li;
  li.classList.add('selected');
  const out = $('explain');
  $('explain-hint').textContent = 'Reading the trail for ' + id + ' ...';
  out.replaceChildren();
  let resp;
  try {
    resp = await fetch('api/explain?id=' + encodeURIComponent(id), { credentials: 'same-origin', cache: 'no-store' });
  } catch (e) {
    $('explain-hint').textContent = 'The page server did not answer: ' + e;
    return;
  }
  if (resp.status === 401) { showLogin('Your session ended; log in again.'); return; }
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) { $('explain-hint').textContent = body.error || resp.statusText; return; }
  $('explain-hint').textContent = 'What caused ' + id + ' (each line\'s causes are indented below it):';
  const items = [];
  let calls = null;
  let after = false;
  for (const l of body.links) {
    let ind = '  '.repeat(l.depth);
    if (l.consequence) {
      // What followed the move: its claim's result, the calls adopted.
      if (!after) items.push(el('li', { class: 'after' }, 'What followed (the claim\'s result and the adoption of the calls):'));
      after = true;
      ind = '  => ';
    }
    if (l.calls && !calls) calls = l.calls;
    if (l.missing) {
      items.push(el('li', { class: 'missing', data: { id: l.id } }, `${ind}? ${l.id} (not in the trail read: live state older than the live stream keeps)`));
      continue;
    }
    if (l.repeat) {
      items.push(el('li', { class: 'repeat', data: { id: l.id } }, `${ind}^ ${l.event.type} ${l.id} (shown above)`));
      continue;
    }
    items.push(el('li', { class: 'link' + (l.consequence ? ' consequence' : ''), data: { id: l.id, type: l.event.type } }, ind,
      el('span', { class: 'time' }, fmtTime(l.event.time) + ' '), eventLine(l.event)));
    for (const p of l.probes || []) {
      const res = p.ok ? 'ok' : `FAIL ${p.error || ''} (${p.error_class || ''})`;
      items.push(el('li', { class: 'probe' }, `${ind}  probe ${fmtTime(p.at)} ${res} in ${Number(p.duration_ms).toFixed(1)}ms`));
    }
  }
  if (calls) items.push(el('li', { class: 'calls' }, calls));
  out.replaceChildren(...items);
}

function connect() {
  if (source) source.close();
  $('login-panel').hidden = true;
  $('app').hidden = false;
  $('logout').hidden = false;
  setConn(false, 'connecting');
  source = new EventSource('api/events');
  if (typeof loadHistory === 'function') loadHistory();
  source.addEventListener('open', () => setConn(true, 'live'));
  source.addEventListener('status', (e) => renderStatus(JSON.parse(e.data)));
  source.addEventListener('event', (e) => addEvent(JSON.parse(e.data)));
  source.addEventListener('error', async () => {
    setConn(false, 'reconnecting');
    // An EventSource does not say why it failed: a 401 means log in again.
    try {
      const r = await fetch('api/status', { credentials: 'same-origin', cache: 'no-store' });
      if (r.status === 401) showLogin('Your session ended; log in again.');
    } catch (e) { /* the server is away; EventSource retries by itself */ }
  });
}

async function start() {
  let r;
  try {
    r = await fetch('api/status', { credentials: 'same-origin', cache: 'no-store' });
  } catch (e) {
    setConn(false, 'server unreachable');
    setTimeout(start, 2000);
    return;
  }
  if (r.status === 401) { showLogin(''); return; }
  connect();
}

$('login').addEventListener('submit', async (e) => {
  e.preventDefault();
  $('login-error').textContent = '';
  const r = await fetch('api/login', {
    method: 'POST', credentials: 'same-origin', cache: 'no-store',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ token: $('token').value }),
  }).catch((err) => ({ ok: false, status: 0, statusText: String(err) }));
  $('token').value = '';
  if (r.ok) { connect(); return; }
  $('login-error').textContent = r.status === 401 ? 'Wrong token.' : 'Login failed: ' + (r.statusText || r.status);
});

$('logout').addEventListener('click', async () => {
  await fetch('api/logout', { method: 'POST', credentials: 'same-origin' }).catch(() => {});
  showLogin('Logged out.');
});

start();
