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
    gRows.push(el('tr', { data: { group: key } },
      el('td', {}, g.cluster), el('td', {}, s.group), el('td', {}, (s.addresses || []).join(', ')),
      el('td', { class: 'holder', data: { holder: s.holder || '' } }, s.holder || '(none)'),
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
        el('td', {}, checks)));
    }
  }
  gb.replaceChildren(...gRows);
  nb.replaceChildren(...nRows);
  $('notes').replaceChildren(...(snap.notes.length ? snap.notes.map((n) => el('li', {}, n))
    : [el('li', {}, 'nothing waiting')]));
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
  for (const l of body.links) {
    const ind = '  '.repeat(l.depth);
    if (l.missing) {
      items.push(el('li', { class: 'missing', data: { id: l.id } }, `${ind}? ${l.id} (not in the trail read: live state older than the live stream keeps)`));
      continue;
    }
    if (l.repeat) {
      items.push(el('li', { class: 'repeat', data: { id: l.id } }, `${ind}^ ${l.event.type} ${l.id} (shown above)`));
      continue;
    }
    items.push(el('li', { class: 'link', data: { id: l.id, type: l.event.type } }, ind,
      el('span', { class: 'time' }, fmtTime(l.event.time) + ' '), eventLine(l.event)));
    for (const p of l.probes || []) {
      const res = p.ok ? 'ok' : `FAIL ${p.error || ''} (${p.error_class || ''})`;
      items.push(el('li', { class: 'probe' }, `${ind}  probe ${fmtTime(p.at)} ${res} in ${Number(p.duration_ms).toFixed(1)}ms`));
    }
  }
  out.replaceChildren(...items);
}

function connect() {
  if (source) source.close();
  $('login-panel').hidden = true;
  $('app').hidden = false;
  $('logout').hidden = false;
  setConn(false, 'connecting');
  source = new EventSource('api/events');
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
