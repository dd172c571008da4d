// The approvals page's script (served from this origin; no build step). It draws the lists
// from /ui/state, follows /ui/events (exception changes redraw the lists; denies are added
// to "Live denies"), and makes every decision with fetch, updating the page in place: the
// page is never reloaded, so what it has gathered (live denies, a note being typed) stays.
// Text goes in with textContent only. Times arrive as Unix seconds or RFC 3339 text; both
// are read.
'use strict';

const CSRF = document.querySelector('meta[name=sandgate-csrf]').content;
let canDecide = document.body.dataset.role === 'approver';
let skew = 0; // the server's clock minus this browser's, in seconds
let ended = false; // the session ended: stop asking
let storeTrouble = false;

// ---- times and durations ----

function secs(v) {
  if (v === null || v === undefined || v === '') return null;
  if (typeof v === 'number') return v;
  if (/^-?\d+$/.test(v)) return Number(v);
  const ms = Date.parse(v);
  return Number.isNaN(ms) ? null : ms / 1000;
}
function serverNow() { return Date.now() / 1000 + skew; }
function pad(n) { return String(n).padStart(2, '0'); }
// Local time; the date too when it is not today.
function clock(s) {
  if (s === null) return '';
  const d = new Date(s * 1000);
  const hms = pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
  if (d.toDateString() === new Date().toDateString()) return hms;
  return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' + hms;
}
function iso(s) { return new Date(s * 1000).toISOString().replace('.000Z', 'Z'); }
function span(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + ' s';
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  const parts = [];
  if (h) parts.push(h + ' h');
  if (m) parts.push(m + ' min');
  if (r) parts.push(r + ' s');
  return parts.join(' ');
}

// ---- elements ----

function el(tag, props, kids) {
  const e = document.createElement(tag);
  Object.assign(e, props || {});
  for (const k of kids || []) if (k !== null && k !== undefined) e.append(k);
  return e;
}
function sub(text) { return el('span', { className: 'sub', textContent: text }); }
function td(tr, text, cls, below) {
  const c = el('td', { className: cls || '' }, [text, below ? sub(below) : null]);
  tr.appendChild(c);
  return c;
}
function timeEl(s) {
  if (s === null) return el('span', { className: 'muted', textContent: '?' });
  return el('time', { dateTime: iso(s), title: iso(s), textContent: clock(s) });
}
function whenCell(tr, t, below) {
  const c = el('td', {}, [timeEl(secs(t)), below ? sub(below) : null]);
  tr.appendChild(c);
  return c;
}
function button(label, id, onClick, cls) {
  const b = el('button', { type: 'button', textContent: label, className: cls || '' });
  if (id) b.id = id;
  b.addEventListener('click', onClick);
  return b;
}
function list(xs) { return (xs || []).join(', '); }
// What an exception allows below its hosts, when it limits it: "read-only", "GET on /org/**".
function requests(e) {
  const methods = e.read_only ? 'read-only (GET, HEAD, OPTIONS)' : e.methods ? list(e.methods) : '';
  const paths = e.paths ? list(e.paths) : '';
  if (!methods && !paths) return '';
  return (methods || 'any method') + ' on ' + (paths || 'any path');
}
// What a tweak asks for one sandbox of `sandgate mcp`, in words:
// "time limit 600 s, output 10 MiB, network, workspace /srv/x".
function byteSize(n) {
  for (const [unit, size] of [['GiB', 1 << 30], ['MiB', 1 << 20], ['KiB', 1 << 10]]) {
    if (n >= size && n % size === 0) return n / size + ' ' + unit;
  }
  return n + ' bytes';
}
function tweakAsks(t) {
  const parts = [];
  if (t.max_seconds) parts.push('time limit ' + t.max_seconds + ' s');
  if (t.max_output_bytes) parts.push('output ' + byteSize(t.max_output_bytes));
  if (t.network) parts.push('network');
  if (t.workspace) parts.push('workspace ' + t.workspace);
  return parts;
}
function tweakText(t) { return 'sandbox ' + t.sandbox + ': ' + tweakAsks(t).join(', '); }
// What an exception is for: its hosts, or a tweak.
function askedFor(e) { return e.tweak ? tweakText(e.tweak) : list(e.hosts); }
function what(e) {
  if (e.tweak) return tweakText(e.tweak) + ' for task ' + e.task_id;
  const r = requests(e);
  return list(e.hosts) + ' (port ' + list(e.ports) + (r ? '; ' + r : '') + ') for task ' + e.task_id;
}
// The cells of what an exception is for: the hosts (what it allows below them beneath), or
// the tweak's sandbox (what it asks beneath); then the ports, which a tweak has none of.
function subjectCells(tr, e) {
  if (e.tweak) {
    // In words, each ask kept on one line: "time limit 120 s, output 10 MiB, ...".
    const asks = tweakAsks(e.tweak).map((a) => el('span', { className: 'ask', textContent: a }));
    const words = el('span', { className: 'sub words' });
    asks.forEach((a, i) => words.append(i ? ', ' : '', a));
    tr.appendChild(el('td', {}, [el('span', { className: 'mono', textContent: 'tweak: sandbox ' + e.tweak.sandbox }), words]));
    td(tr, '—', 'muted');
  } else {
    td(tr, list(e.hosts), 'mono', requests(e));
    td(tr, list(e.ports), 'mono');
  }
}

// ---- talking to the server ----

function say(text, bad) {
  const s = document.getElementById('status');
  s.textContent = text;
  s.className = bad ? 'error' : 'ok';
}
function sessionEnded() {
  ended = true;
  const s = document.getElementById('status');
  s.className = 'error';
  s.replaceChildren('Your session ended. ', el('a', { href: '/ui', textContent: 'Log in again' }), '.');
}
// POSTs the form fields with the session's CSRF token; {ok, data} or {ok: false, error}.
async function post(path, fields) {
  const body = new URLSearchParams(Object.assign({ csrf: CSRF }, fields));
  let r;
  try {
    r = await fetch(path, { method: 'POST', body, credentials: 'same-origin' });
  } catch (e) {
    return { ok: false, error: 'The proxy did not answer: ' + e.message };
  }
  let data = null;
  try { data = await r.json(); } catch (_) { /* not JSON */ }
  if (r.status === 401) sessionEnded();
  if (r.ok) return { ok: true, data };
  return { ok: false, error: (data && data.error) || 'HTTP ' + r.status };
}
// One action: the buttons beside it wait, the answer is said, the lists are redrawn.
async function act(btn, path, fields, done) {
  const around = Array.from((btn.closest('td') || btn).querySelectorAll('button, select, input'));
  around.forEach((b) => { b.disabled = true; });
  const r = await post(path, fields);
  around.forEach((b) => { b.disabled = false; });
  if (!r.ok) {
    if (!ended) say('Refused: ' + r.error, true);
    return;
  }
  say(done(r.data.exception, r.data));
  await refresh();
}

// ---- the three lists of exceptions ----

// Draws rows keyed by exception id: a row whose exception is unchanged is kept as it is
// (with its TTL choice, and an open question below it with the note being typed), one that
// changed is drawn again, one that left is removed with its question.
function fill(id, rows, cols, render) {
  const body = document.querySelector('#' + id + ' tbody');
  const wanted = new Map();
  for (const e of rows) wanted.set(e.id, JSON.stringify(e) + canDecide);
  const kept = new Map();
  for (const tr of Array.from(body.rows)) {
    if (tr.dataset.id && wanted.get(tr.dataset.id) === tr.dataset.key) kept.set(tr.dataset.id, tr);
    else if (!(tr.dataset.panelFor && kept.has(tr.dataset.panelFor))) tr.remove();
  }
  const panelOf = (tr) => {
    const next = tr.nextElementSibling;
    return next && next.dataset.panelFor === tr.dataset.id ? next : null;
  };
  // Rows only arrive and leave (the order of those that stay holds), so a kept row is moved
  // only if it is out of place: a moved row would lose the focus of a note being typed.
  let cursor = body.firstElementChild;
  for (const e of rows) {
    let tr = kept.get(e.id);
    if (!tr) {
      tr = el('tr', { id: id + '-row-' + e.id });
      tr.dataset.id = e.id;
      tr.dataset.key = wanted.get(e.id);
      render(tr, e);
    }
    if (tr === cursor) {
      cursor = (panelOf(tr) || tr).nextElementSibling;
    } else {
      const panel = panelOf(tr);
      body.insertBefore(tr, cursor);
      if (panel) body.insertBefore(panel, cursor);
    }
  }
  if (!rows.length) {
    const tr = el('tr', { className: 'empty' });
    td(tr, 'none').colSpan = cols;
    body.appendChild(tr);
  }
}

// A decision that asks first: a row below the exception's, across the table, so the
// columns do not move. It takes a note (deny, revoke), or the controls `o.controls` whose
// values `o.fields()` gives (a tweak's approval).
function openPanel(tr, o) {
  const open = tr.nextElementSibling;
  if (open && open.dataset.panelFor === tr.dataset.id) {
    open.querySelector('input, select').focus();
    return;
  }
  const row = el('tr', { className: 'panel-row' + (o.style === 'go' ? ' grant' : ''), id: o.verb + '-panel-' + o.id });
  row.dataset.panelFor = tr.dataset.id;
  let controls = o.controls, fields = o.fields;
  if (!controls) {
    const note = el('input', { type: 'text', className: 'note', id: o.verb + '-note-' + o.id, placeholder: 'optional; kept on record', maxLength: 1000 });
    controls = [el('label', {}, ['Note ', note])];
    fields = () => ({ note: note.value });
  }
  const go = button(o.label, o.verb + '-confirm-' + o.id, () => act(go, o.path, fields(), o.done), o.style || 'danger');
  const cancel = button('Cancel', o.verb + '-cancel-' + o.id, () => row.remove());
  row.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && ev.target.type === 'text') go.click();
    if (ev.key === 'Escape') cancel.click();
  });
  const ask = el('span', { className: 'panel' }, [
    el('span', { className: o.style === 'go' ? 'question' : 'warn', textContent: o.question })].concat(controls, [go, cancel]));
  row.appendChild(el('td', { colSpan: tr.cells.length }, [ask]));
  tr.after(row);
  row.querySelector('input, select').focus();
}

function ttlChoice(e) {
  const s = el('select', { id: 'ttl-' + e.id, title: 'how long the exception lasts once approved' });
  const asked = e.ttl_seconds;
  for (const t of [60, 300, 900, 3600].filter((t) => t < asked).concat([asked])) {
    s.appendChild(el('option', { value: String(t), textContent: span(t) + (t === asked ? ' (as asked)' : ''), selected: t === asked }));
  }
  return s;
}

// A choice of a tweak's value: nothing, the standard values below the one asked, then the
// one asked (chosen); never more than asked.
function lessChoice(id, asked, standard, words) {
  const s = el('select', { id });
  s.appendChild(el('option', { value: '', textContent: 'not granted' }));
  for (const v of standard.filter((v) => v < asked).concat([asked])) {
    s.appendChild(el('option', { value: String(v), textContent: words(v) + (v === asked ? ' (as asked)' : ''), selected: v === asked }));
  }
  return s;
}

// What a tweak's approval grants, each control starting at what was asked and offering
// only less: a time limit and an output size from shorter choices, the network box
// (unticked: not granted), a workspace (the one asked, or one under it: the server refuses
// any other). The sandbox is the one asked.
function tweakGrant(e) {
  const t = e.tweak, controls = [], read = [];
  if (t.max_seconds) {
    const s = lessChoice('tweak-max-seconds-' + e.id, t.max_seconds, [10, 30, 60, 120, 300, 600, 1800], (v) => v + ' s');
    controls.push(el('label', {}, ['time limit ', s]));
    read.push(() => ({ tweak_max_seconds: s.value }));
  }
  if (t.max_output_bytes) {
    const sizes = [1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26];
    const s = lessChoice('tweak-output-' + e.id, t.max_output_bytes, sizes, byteSize);
    controls.push(el('label', {}, ['output ', s]));
    read.push(() => ({ tweak_max_output_bytes: s.value }));
  }
  if (t.network) {
    const b = el('input', { type: 'checkbox', id: 'tweak-network-' + e.id, checked: true });
    controls.push(el('label', {}, [b, ' network']));
    read.push(() => (b.checked ? { tweak_network: 'on' } : {}));
  }
  if (t.workspace) {
    const w = el('input', { type: 'text', className: 'path', id: 'tweak-workspace-' + e.id, value: t.workspace, title: 'the workspace asked, or a directory under it; empty: none' });
    controls.push(el('label', {}, ['workspace ', w]));
    read.push(() => ({ tweak_workspace: w.value }));
  }
  return { controls, fields: () => Object.assign({ tweak_sandbox: t.sandbox }, ...read.map((f) => f())) };
}

function approved(x) {
  return 'Approved ' + askedFor(x) + (x.read_only ? ' read-only' : '') + ' for task ' + x.task_id + ' for ' + span(x.ttl_seconds) + '.';
}

function pendingRow(tr, e) {
  whenCell(tr, e.requested_at, 'by ' + e.requested_by);
  td(tr, e.task_id, 'mono');
  subjectCells(tr, e);
  td(tr, span(e.ttl_seconds));
  td(tr, e.reason);
  const c = td(tr, '', 'act');
  if (!canDecide) return;
  const ttl = ttlChoice(e);
  const path = '/ui/approve/' + encodeURIComponent(e.id);
  // Read-only narrows a request that named no methods (it could only widen one that did).
  const ro = e.tweak || e.methods || e.read_only ? null : el('input', { type: 'checkbox', id: 'read-only-' + e.id });
  // A tweak is approved after a look at what it grants, which may be less than asked.
  const approve = e.tweak
    ? button('Approve…', 'approve-' + e.id, () => {
      const grant = tweakGrant(e);
      openPanel(tr, {
        verb: 'approve', id: e.id, label: 'Approve', style: 'go', path,
        question: 'Grant sandbox ' + e.tweak.sandbox + ' for task ' + e.task_id + ', at most what was asked:',
        controls: grant.controls, fields: () => Object.assign({ ttl: ttl.value }, grant.fields()), done: approved,
      });
    })
    : button('Approve', 'approve-' + e.id, () => act(approve, path,
      Object.assign({ ttl: ttl.value }, ro && ro.checked ? { read_only: 'on' } : {}), approved));
  const deny = button('Deny…', 'deny-' + e.id, () => openPanel(tr, {
    verb: 'deny', id: e.id, question: 'Deny ' + what(e) + '?', label: 'Deny', path: '/ui/deny/' + encodeURIComponent(e.id),
    done: (x) => 'Denied ' + askedFor(x) + ' for task ' + x.task_id + '.',
  }));
  c.append(ttl);
  if (ro) c.append(el('label', { title: 'approve GET, HEAD and OPTIONS only' }, [ro, ' read-only']));
  c.append(approve, deny);
}

function activeRow(tr, e) {
  whenCell(tr, e.decided_at, 'by ' + (e.decided_by || '?'));
  td(tr, e.task_id, 'mono');
  subjectCells(tr, e);
  const expires = secs(e.expires_at);
  const left = el('span', { className: 'countdown' });
  left.dataset.expires = String(expires);
  tr.appendChild(el('td', {}, [left, sub('until ' + clock(expires) + ' (of ' + span(e.ttl_seconds) + ')')]));
  td(tr, e.reason, '', 'asked by ' + e.requested_by);
  const c = td(tr, '', 'act');
  if (!canDecide) return;
  c.append(button('Revoke…', 'revoke-' + e.id, () => openPanel(tr, {
    verb: 'revoke', id: e.id, label: 'Revoke now',
    // A tweak cuts no connection: the next run no longer gets it, and one running that
    // needed it ends when the tweak would have expired.
    question: 'Revoke ' + what(e) + ' now? ' + (e.tweak ? 'The next run no longer gets it, and a run already going under it is stopped within about a second.' : 'Its open connections are cut at once.'),
    path: '/ui/revoke/' + encodeURIComponent(e.id),
    done: (x) => 'Revoked ' + askedFor(x) + ' for task ' + x.task_id + (x.tweak ? '.' : '; its connections were cut.'),
  })));
}

const DID = { denied: 'denied', revoked: 'revoked', expired: 'approved' };
function recentRow(tr, e) {
  td(tr, e.state, 'state state-' + e.state);
  whenCell(tr, e.decided_at, (DID[e.state] || e.state) + ' by ' + (e.decided_by || '?'));
  td(tr, e.task_id, 'mono');
  subjectCells(tr, e);
  const end = secs(e.expires_at);
  if (e.state === 'denied') td(tr, span(e.ttl_seconds), '', 'asked');
  else td(tr, span(e.ttl_seconds), '', (e.state === 'revoked' ? 'revoked at ' : 'expired at ') + clock(end));
  td(tr, e.reason, '', 'asked by ' + e.requested_by + ' at ' + clock(secs(e.requested_at)));
  td(tr, e.note || '—', e.note ? '' : 'muted');
}

// Countdowns from each exception's expiry and the server's clock; redraws when one ends.
let redraw = null;
function tick() {
  let over = false;
  for (const c of document.querySelectorAll('#active .countdown')) {
    const left = Math.max(0, Math.round(Number(c.dataset.expires) - serverNow()));
    c.dataset.left = String(left);
    c.textContent = left > 0 ? span(left) + ' left' : 'expired';
    if (left === 0) over = true;
  }
  if (over && !redraw) redraw = setTimeout(() => { redraw = null; refresh(); }, 1000);
}

let asked = 0; // refreshes started; only the latest one's answer is drawn
async function refresh() {
  if (ended) return;
  const mine = ++asked;
  let s;
  try {
    const r = await fetch('/ui/state', { credentials: 'same-origin', cache: 'no-store' });
    if (r.status === 401) { sessionEnded(); return; }
    if (!r.ok) {
      storeTrouble = true;
      say('The exception store did not answer (HTTP ' + r.status + '); trying again.', true);
      return;
    }
    s = await r.json();
  } catch (_) {
    return;
  }
  if (mine !== asked) return; // a later refresh is under way: its answer is newer
  if (storeTrouble) { storeTrouble = false; say(''); }
  const now = secs(s.now);
  if (now !== null) skew = now - Date.now() / 1000;
  canDecide = s.can_decide;
  fill('pending', s.pending, 7, pendingRow);
  fill('active', s.active, 7, activeRow);
  fill('recent', s.recent, 8, recentRow);
  tick();
}

// ---- live denies ----

const denies = new Map(); // task|host|port -> its row's parts
let denyRows = 0;
function isAddress(host) { return host.includes(':') || /^[0-9.]+$/.test(host); }

function allowControls(cell, e) {
  const host = e.destination_host || '';
  if (!e.task_id) return cell.append(sub('no task: an exception is for one task'));
  if (e.reason_code !== 'not_allowlisted') return cell.append(sub('not an allowlist miss: an exception would not pass it'));
  if (isAddress(host)) return cell.append(sub('an address: an exception names a host'));
  const ttl = el('select', { className: 'allow-ttl', title: 'for how long' });
  for (const m of [1, 5, 15, 60]) ttl.appendChild(el('option', { value: String(m * 60), textContent: m + ' min', selected: m === 5 }));
  const go = button('Allow for', null, () => act(go, '/ui/allow', {
    task: e.task_id, host, port: String(e.destination_port), ttl: ttl.value, request_id: e.request_id || '',
  }, (x, data) => {
    const until = clock(secs(x.expires_at));
    cell.replaceChildren(el('span', { className: 'done', textContent: 'allowed until ' + until }), sub(x.id));
    return (data.existing ? 'Already allowed: ' : 'Allowed ') + host + ':' + e.destination_port + ' for task ' + x.task_id
      + ' until ' + until + (data.existing ? ' (' + x.id + ').' : ', recorded as your approval (' + x.id + ').');
  }), 'allow');
  cell.append(go, ttl);
}

function addDeny(e) {
  const body = document.querySelector('#denies tbody');
  const empty = body.querySelector('tr.empty');
  if (empty) empty.remove();
  const key = [e.task_id, e.destination_host, e.destination_port].join('|');
  const seen = secs(e.created_at);
  const known = denies.get(key);
  if (known) {
    known.count += 1;
    known.seen.replaceChildren(timeEl(seen), el('span', { className: 'count', textContent: '×' + known.count }));
    return;
  }
  denyRows += 1;
  const tr = el('tr', { className: 'deny', id: 'deny-row-' + denyRows });
  const seenCell = el('td', {}, [timeEl(seen)]);
  tr.appendChild(seenCell);
  td(tr, e.task_id || '—', 'mono');
  td(tr, (e.destination_host || '?') + ':' + (e.destination_port || ''), 'mono');
  td(tr, e.reason_code || '', '', e.request_id ? 'request ' + e.request_id : null);
  const c = td(tr, '', 'act');
  if (canDecide) allowControls(c, e);
  body.insertBefore(tr, body.rows[0] || null);
  denies.set(key, { seen: seenCell, count: 1 });
  while (body.rows.length > 50) {
    const last = body.rows[body.rows.length - 1];
    for (const [k, v] of denies) if (v.seen.parentNode === last) denies.delete(k);
    last.remove();
  }
}

function follow() {
  const live = new EventSource('/ui/events');
  live.onopen = () => { document.body.dataset.live = 'open'; };
  live.onmessage = (m) => {
    let e;
    try { e = JSON.parse(m.data); } catch (_) { return; }
    if (e.event && e.event.startsWith('exception_')) { refresh(); return; }
    if (e.event === 'decision' && e.decision === 'deny') addDeny(e);
  };
  // The browser reconnects by itself; a stream refused for good (the session ended) is
  // found by the next poll.
  live.onerror = () => {
    delete document.body.dataset.live;
    if (live.readyState === EventSource.CLOSED) refresh();
  };
}

follow();
refresh();
setInterval(() => { if (!ended) refresh(); }, 5000);
setInterval(tick, 1000);
