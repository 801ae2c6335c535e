// agentstate console: plain JS, no build step. Talks only to this console's /api.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, cls, text) => {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
};

// Markdown, rendered safely: the text is parsed into DOM nodes built with textContent, so
// no input can become HTML (no innerHTML anywhere in this file). Links keep http(s) only.
function inline(text, parent) {
  const re = /(`[^`]+`)|(\*\*[^*]+\*\*)|(\*[^*\s][^*]*\*)|(\[[^\]]+\]\([^)\s]+\))/g;
  let last = 0, m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
    const t = m[0];
    if (m[1]) parent.append(el("code", "", t.slice(1, -1)));
    else if (m[2]) { const b = el("strong"); inline(t.slice(2, -2), b); parent.append(b); }
    else if (m[3]) { const i = el("em"); inline(t.slice(1, -1), i); parent.append(i); }
    else {
      const label = t.slice(1, t.indexOf("]("));
      const href = t.slice(t.indexOf("](") + 2, -1);
      if (/^https?:\/\//i.test(href)) {
        const a = el("a", "", label);
        a.href = href; a.target = "_blank"; a.rel = "noopener noreferrer";
        parent.append(a);
      } else parent.append(document.createTextNode(t));
    }
    last = m.index + t.length;
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

function markdown(text) {
  const root = el("div", "md");
  const lines = String(text).split("\n");
  let list = null, para = null;
  const close = () => { list = null; para = null; };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (line.startsWith("```")) {
      const code = [];
      for (i++; i < lines.length && !lines[i].startsWith("```"); i++) code.push(lines[i]);
      const pre = el("pre"); pre.append(el("code", "", code.join("\n")));
      root.append(pre); close(); continue;
    }
    let m;
    if (!line.trim()) { close(); continue; }
    if ((m = line.match(/^(#{1,4})\s+(.*)$/))) {
      const h = el(`h${Math.min(6, m[1].length + 2)}`); inline(m[2], h); root.append(h); close(); continue;
    }
    if ((m = line.match(/^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/))) {
      const tag = m[1] ? "ol" : "ul";
      if (!list || list.tagName.toLowerCase() !== tag) { list = el(tag); root.append(list); para = null; }
      const li = el("li"); inline(m[2], li); list.append(li); continue;
    }
    if ((m = line.match(/^>\s?(.*)$/))) {
      const q = el("blockquote"); inline(m[1], q); root.append(q); close(); continue;
    }
    list = null;
    if (!para) { para = el("p"); root.append(para); } else para.append(el("br"));
    inline(line, para);
  }
  return root;
}

const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;

function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const today = new Date();
  return d.toDateString() === today.toDateString()
    ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : d.toLocaleDateString([], { month: "short", day: "numeric" }) + " " + d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

const ui = {
  cid: "",            // current conversation ("" = a new one)
  streaming: false,
  watching: false,    // following a turn another page (or replica) runs
  watchAbort: null,
  taskId: "",
  abort: null,        // the running stream's AbortController
  nextConversations: "",
  conversationsSeq: 0, // the newest list load (older answers are dropped)
  nextMessages: "",
  titles: {},
  pollTimer: null,
  question: "",       // what the running turn was asked (kept in the box until it starts)
  retry: "",          // a question to ask again once the running turn has stopped
  loaded: false,      // the first load of the conversation list worked
  traceUrl: "",       // CONSOLE_TRACE_URL_TEMPLATE
  timelines: {},      // message id -> the timeline saved on that reply record
  shownTimeline: "",  // the message id whose timeline the panel shows ("" = the newest)
};

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = {};
  try { data = await res.json(); } catch (e) { data = {}; }
  if (!res.ok) {
    const error = new Error(data.error || `The console answered ${res.status}.`);
    error.status = res.status;
    throw error;
  }
  return data;
}

function notice(text, kind) {
  const box = $("#notice");
  box.hidden = !text;
  box.textContent = text || "";
  box.className = "notice" + (kind === "info" ? " info" : "");
}

// ---------------------------------------------------------------- conversations

const STATUS_TEXT = {
  RUNNING: "running", AWAITING_CONFIRMATION: "card", FAILED: "failed", IDLE: "",
};

async function loadConversations(more) {
  const token = more ? ui.nextConversations : "";
  // The search runs on the server (ListConversations filters): a title prefix and a
  // status, paged like the whole list.
  const query = new URLSearchParams();
  if (token) query.set("page_token", token);
  const q = $("#search-title").value.trim();
  if (q) query.set("q", q);
  const status = $("#search-status").value;
  if (status) query.set("status", status);
  // A slower, older answer (typing on) must not replace a newer one.
  const seq = ++ui.conversationsSeq;
  const data = await api("GET", "/api/conversations" + (query.size ? `?${query}` : ""));
  if (seq !== ui.conversationsSeq) return;
  const list = $("#conversations");
  if (!more) list.replaceChildren();
  for (const c of data.conversations) {
    ui.titles[c.conversation_id] = c.title;
    const li = el("li");
    li.dataset.conversationId = c.conversation_id;
    if (c.conversation_id === ui.cid) li.classList.add("current");
    const box = el("input");
    box.type = "checkbox";
    box.title = "Select for batch delete";
    box.addEventListener("change", updateBatchButton);
    const title = el("span", "title");
    const name = el("span", "name", c.title || "(untitled)");
    // Two equal titles stay apart: each row shows when it changed last and its id.
    const stamp = el("span", "when", `${when(c.update_time)} · #${c.conversation_id}`);
    stamp.dataset.field = "updated";
    title.append(name, stamp);
    title.title = `${c.title}\nstarted ${new Date(c.create_time).toLocaleString()}\nlast change ${new Date(c.update_time).toLocaleString()}`;
    title.addEventListener("click", () => go(c.conversation_id));
    const rename = el("button", "rename", "✎");
    rename.title = "Rename";
    rename.addEventListener("click", () => renameConversation(c.conversation_id));
    const del = el("button", "delete danger", "✕");
    del.title = "Delete";
    del.addEventListener("click", () => deleteConversations([c.conversation_id]));
    const extras = Object.entries(c.labels || {}).map(([k, v]) =>
      el("span", "label", v ? `${k}=${v}` : k));
    if (STATUS_TEXT[c.status]) {  // idle conversations carry no badge
      const badge = el("span", `status ${c.status}`, STATUS_TEXT[c.status]);
      badge.title = "Status, kept by the state service";
      extras.push(badge);
    }
    li.append(box, title, ...extras, rename, del);
    list.append(li);
  }
  ui.nextConversations = data.next_page_token;
  $("#more-conversations").hidden = !data.next_page_token;
  ui.loaded = true;
  filterConversations();
  updateBatchButton();
}

// The list shows what the search found; "none" says so.
function filterConversations() {
  const none = $("#no-match");
  const searching = $("#search-title").value.trim() || $("#search-status").value;
  if (none) none.hidden = !(searching && !document.querySelector("#conversations li"));
}

let searchTimer = null;
function searchChanged() {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => loadConversations(false).catch((e) => notice(e.message)), 250);
}

function selectedIds() {
  return [...document.querySelectorAll("#conversations li")]
    .filter((li) => li.querySelector("input").checked)
    .map((li) => li.dataset.conversationId);
}

function updateBatchButton() {
  const n = selectedIds().length;
  const button = $("#delete-selected");
  button.disabled = n === 0;
  button.textContent = n ? `Delete selected (${n})` : "Delete selected";
}

async function renameConversation(cid) {
  const title = prompt("New title for this conversation:", ui.titles[cid] || "");
  if (title === null) return;
  try {
    await api("POST", `/api/conversations/${cid}/rename`, { title });
    notice("");
    await loadConversations(false);
    if (cid === ui.cid) $("#chat-title").textContent = title.trim();
  } catch (e) { notice(e.message); }
}

async function deleteConversations(ids) {
  const what = ids.length === 1
    ? `the conversation “${ui.titles[ids[0]] || ids[0]}”`
    : plural(ids.length, "conversation", "conversations");
  if (!confirm(`Delete ${what}? Its messages and its agent state are removed for good.`)) return;
  try {
    let deleted = 1;
    if (ids.length === 1) await api("DELETE", `/api/conversations/${ids[0]}`);
    else deleted = (await api("POST", "/api/conversations/batch-delete", { conversation_ids: ids })).deleted;
    // The count the service deleted (another tab may have deleted some already).
    notice(`Deleted ${plural(deleted, "conversation", "conversations")}.`, "info");
    if (ids.includes(ui.cid)) go("");
    await loadConversations(false);
  } catch (e) { notice(e.message); }
}

// ---------------------------------------------------------------- history

function renderCard(card, cid) {
  const box = el("div", "card" + (card.open ? "" : " settled"));
  box.dataset.messageId = card.message_id;
  box.append(el("h4", "", card.title));
  for (const call of card.calls) {
    if (call.title && call.title !== card.title) box.append(el("div", "", call.title));
    const dl = el("dl");
    for (const [label, value] of call.fields) dl.append(el("dt", "", label), el("dd", "", value));
    box.append(dl);
    // What will run, from the call's input: the tool and every argument it gets.
    const will = el("div", "will");
    will.dataset.field = "will-run";
    will.append(el("span", "muted", "Approving runs "), el("code", "", call.tool_name), el("span", "muted", " with:"));
    const args = el("dl", "arguments");
    const entries = Object.entries(call.arguments || {});
    for (const [k, v] of entries) args.append(el("dt", "", k), el("dd", "", typeof v === "string" ? v : JSON.stringify(v)));
    if (!entries.length) args.append(el("dd", "muted", "(no arguments)"));
    box.append(will, args);
  }
  if (card.open) {
    const buttons = el("div", "buttons");
    const approve = el("button", "approve primary", "Approve");
    const cancel = el("button", "cancel", "Cancel");
    const answer = (approved) => {
      approve.disabled = cancel.disabled = true;  // one answer per card, even on a double click
      confirmCard(cid, card.message_id, approved);
    };
    approve.addEventListener("click", () => answer(true));
    cancel.addEventListener("click", () => answer(false));
    buttons.append(approve, cancel);
    box.append(buttons);
    if (card.expires_at) box.append(el("div", "muted", `Answer before ${new Date(card.expires_at).toLocaleString()}.`));
  } else {
    box.append(el("div", "outcome", card.words));
  }
  return box;
}

function toolRow(name, args, words, detail, output) {
  const row = el("div", "tool");
  row.append(el("span", "", `⚙ ${name} ${JSON.stringify(args)} · `), el("span", "words", words || ""));
  if (detail) row.append(el("span", "detail", ` ${detail}`));
  if (output) {
    const more = el("details", "output");
    more.append(el("summary", "", "output"), el("pre", "", output));
    row.append(more);
  }
  return row;
}

// The timeline of one turn, from its stored reply record: model calls, tool calls with
// their inputs and outputs, durations, tokens, the turn's start (lease, state load), the
// save, and the trace id (a link when CONSOLE_TRACE_URL_TEMPLATE is set).
function renderTimeline() {
  const box = $("#timeline-body");
  if (!box) return;
  const ids = Object.keys(ui.timelines).filter((id) => document.querySelector(`#messages .msg[data-message-id="${id}"]`));
  const id = ids.includes(ui.shownTimeline) ? ui.shownTimeline : ids.sort((a, b) => (BigInt(a) < BigInt(b) ? -1 : 1)).pop();
  if (!id) { box.replaceChildren(el("p", "muted", "No saved turn on this page yet.")); return; }
  const t = ui.timelines[id];
  const parts = [];
  const head = el("div", "timeline-head");
  head.append(el("span", "", `Turn of ${new Date(t.started_at).toLocaleString()} · ${t.total_ms} ms`));
  parts.push(head);
  const trace = el("div", "trace");
  trace.dataset.field = "trace";
  if (t.trace_id && ui.traceUrl) {
    const a = el("a", "", `trace ${t.trace_id}`);
    a.href = ui.traceUrl.replace("{trace_id}", encodeURIComponent(t.trace_id));
    a.target = "_blank"; a.rel = "noopener noreferrer";
    trace.append(a);
  } else trace.textContent = t.trace_id ? `trace ${t.trace_id}` : "no trace id (tracing off)";
  parts.push(trace);
  const table = el("table", "timeline");
  const header = el("tr");
  header.append(el("th", "", "at"), el("th", "", "what"), el("th", "", "took"), el("th", "", "details"));
  table.append(header);
  for (const e of t.events) {
    const tr = el("tr", `tl-${e.kind}`);
    tr.dataset.kind = e.kind;
    const details = el("td");
    const facts = [];
    if (e.kind === "model") {
      if (e.tokens) facts.push(`tokens in ${e.tokens.input_tokens}, out ${e.tokens.output_tokens}`);
      if (e.tool_calls && e.tool_calls.length) facts.push(`asked for ${e.tool_calls.join(", ")}`);
      if (e.failed) facts.push(`ended: ${e.failed}`);
    } else if (e.kind === "tool") {
      facts.push(`${e.outcome}`, `input ${JSON.stringify(e.input)}`);
    } else if (e.kind === "begin") {
      facts.push(`task ${e.task_id}`, `state version ${e.version}`);
    } else if (e.kind === "save") {
      facts.push(`from version ${e.expected_version}`, `${e.mode}`, `${e.state_bytes} bytes`, `${e.messages} messages`);
    } else if (e.kind === "compaction") {
      facts.push(`messages ${e.messages}`, `tokens ${e.tokens}`, e.reason);
    }
    details.append(el("div", "", facts.join(" · ")));
    if (e.kind === "tool" && e.output) {
      const more = el("details");
      more.append(el("summary", "", "output"), el("pre", "", e.output));
      details.append(more);
    }
    const name = e.kind === "model" ? `model ${e.name}` : e.kind === "tool" ? `tool ${e.name}` : e.name;
    tr.append(el("td", "", `+${e.at_ms} ms`), el("td", "", name), el("td", "", e.ms === undefined ? "" : `${e.ms} ms`), details);
    table.append(tr);
  }
  parts.push(table);
  box.replaceChildren(...parts);
}

// ---------------------------------------------------------------- framework sessions

const FRAMEWORKS = { langgraph: "LangGraph thread", "openai-agents": "OpenAI Agents session", adk: "ADK session" };

function jsonBlock(value) {
  return el("pre", "json", typeof value === "string" ? value : JSON.stringify(value, null, 2));
}

function folded(summary, value, open) {
  const d = el("details");
  if (open) d.open = true;
  d.append(el("summary", "", summary), jsonBlock(value));
  return d;
}

// A conversation another framework keeps here: shown read-only, in its own terms.
async function showFramework(cid) {
  let data;
  try { data = await api("GET", `/api/conversations/${cid}/framework`); } catch (e) { return false; }
  if (cid !== ui.cid || data.kind === "agentstate") return false;
  const box = $("#messages");
  const view = el("div", `framework ${data.kind}`);
  view.dataset.kind = data.kind;
  view.append(el("div", "framework-head", `${FRAMEWORKS[data.kind]} · read-only here (its framework writes it)`));
  if (data.kind === "langgraph") {
    view.append(el("div", "muted", `thread ${data.thread_id} · ${plural(data.checkpoints.length, "checkpoint", "checkpoints")}${data.more_checkpoints ? " (newest shown)" : ""}`));
    for (const value of data.waiting) {
      const card = el("div", "card waiting");
      card.dataset.field = "interrupt";
      card.append(el("h4", "", "The graph is waiting for a human"), jsonBlock(value.value !== undefined ? value.value : value));
      card.append(el("div", "muted", "Answer it from the graph's own client (Command(resume=…)); the console only reads."));
      view.append(card);
    }
    for (const [i, c] of data.checkpoints.entries()) {
      const item = el("div", "checkpoint");
      item.dataset.checkpointId = c.checkpoint_id;
      const step = c.metadata && c.metadata.step !== undefined ? `step ${c.metadata.step}` : "";
      item.append(el("div", "checkpoint-head", `${i === 0 ? "newest · " : ""}${step} ${c.metadata && c.metadata.source ? c.metadata.source : ""} · ${new Date(c.create_time).toLocaleString()} · ${c.checkpoint_id}`));
      item.append(folded("channel values", c.channel_values, i === 0));
      if (c.pending_writes.length) item.append(folded(`pending writes (${c.pending_writes.length})`, c.pending_writes, i === 0));
      item.append(folded("metadata", c.metadata, false));
      view.append(item);
    }
  } else if (data.kind === "openai-agents") {
    view.append(el("div", "muted", `session ${data.session_id} · ${plural(data.items.length, "item", "items")}`));
    for (const it of data.items) {
      const role = it.item && (it.item.role || it.item.type) ? (it.item.role || it.item.type) : "item";
      const row = el("div", `item ${role}`);
      row.append(el("div", "item-head", `#${it.seq} ${role} · ${new Date(it.time).toLocaleString()}`), jsonBlock(it.item));
      view.append(row);
    }
  } else if (data.kind === "adk") {
    view.append(el("div", "muted", `app ${data.app_name} · session ${data.session_id} · ${plural(data.events.length, "event", "events")}`));
    const scopes = el("div", "scopes");
    for (const scope of ["session", "user", "app"]) {
      const s = el("div", "scope");
      s.dataset.scope = scope;
      s.append(el("div", "scope-head", `${scope} state`), jsonBlock(data.state[scope]));
      scopes.append(s);
    }
    view.append(scopes);
    for (const ev of data.events) {
      const author = ev.item && ev.item.author ? ev.item.author : "event";
      const row = el("div", "item event");
      row.append(el("div", "item-head", `#${ev.seq} ${author} · ${new Date(ev.time).toLocaleString()}`), jsonBlock(ev.item));
      view.append(row);
    }
  }
  box.replaceChildren(view);
  $("#chat-title").textContent = `${FRAMEWORKS[data.kind]} ${data.thread_id || data.session_id || cid}`;
  $("#send").disabled = true;
  note(`This ${FRAMEWORKS[data.kind]} is read-only here: its framework writes it.`);
  $("#inspector-body").replaceChildren(el("p", "muted", "The AgentState inspector is for the agent service's own conversations; this one's data is shown beside."));
  return true;
}

function renderRecord(view, cid) {
  const div = el("div", `msg ${view.role}` + (view.error ? " error" : ""));
  div.dataset.messageId = view.message_id;
  for (const item of view.items) {
    if (item.kind === "text") {
      const text = el("div", "text");
      // The user's words as typed; the assistant's as markdown (rendered safely).
      if (view.role === "user") text.textContent = item.text;
      else text.append(markdown(item.text));
      div.append(text);
    } else if (item.kind === "thinking") div.append(el("div", "thinking", item.text));
    else if (item.kind === "tool") div.append(toolRow(item.tool_name, item.arguments, item.words, item.detail, item.output));
  }
  if (view.card) div.append(renderCard(view.card, cid));
  // A failed turn: what was streamed stays as a partial answer, then the failure's sentence.
  if (view.partial) div.append(el("div", "status partial", "(partial answer: the turn did not finish)"));
  if (view.error_text) div.append(el("div", "error-text", view.error_text));
  if (view.status_words) div.append(el("div", "status", view.status_words));
  if (view.role === "user" && !view.items.length && !view.card) return null;  // a card's answer
  if (view.timeline) {
    ui.timelines[view.message_id] = view.timeline;
    const button = el("button", "show-timeline", "Timeline of this turn");
    button.title = "Show this turn's timeline in the inspector";
    button.addEventListener("click", () => { ui.shownTimeline = view.message_id; renderTimeline(); });
    div.append(button);
  }
  if (view.create_time) {
    const t = el("div", "stamp", when(view.create_time));
    t.title = new Date(view.create_time).toLocaleString();
    div.append(t);
  }
  return div;
}

// History opens at the newest page; "Show earlier messages" adds the page before it.
async function loadHistory(more) {
  const cid = ui.cid;
  const before = more ? ui.nextMessages : "";
  const data = await api("GET", `/api/conversations/${cid}/messages?order=newest` + (before ? `&before=${encodeURIComponent(before)}` : ""));
  if (cid !== ui.cid) return data;
  const box = $("#messages");
  if (!more) box.replaceChildren();
  const nodes = data.records.map((view) => renderRecord(view, cid)).filter(Boolean);
  if (more) box.prepend(...nodes); else box.append(...nodes);
  ui.nextMessages = data.earlier;
  $("#more-messages").hidden = !data.earlier;
  if (!more) scrollDown();
  renderTimeline();
  return data;
}

// A turn still being written (a reload, a second tab, a closed stream): attach to it.
function resumeFromRecords() {
  clearTimeout(ui.pollTimer);
  const cid = ui.cid;
  const tick = async () => {
    if (cid !== ui.cid || ui.streaming || ui.watching) return;
    try {
      const data = await loadHistory(false);
      await loadInspector();
      const running = data.records.find((r) => r.streaming);
      if (running) watchTurn(cid, running.message_id);
      else notice("");
    } catch (e) { notice(e.message); }
  };
  tick();
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Follow a running turn from its record (whichever replica runs it): its streamed text,
// tool calls and progress as they happen, with Stop. A dropped stream resumes after the
// last event seen (`after`); the turn's end redraws the conversation from the records.
async function watchTurn(cid, messageId) {
  if (ui.watching || ui.streaming) return;
  ui.watching = true;
  const controller = new AbortController();
  ui.watchAbort = controller;
  const old = document.querySelector(`#messages .msg[data-message-id="${messageId}"]`);
  const turn = liveTurn();
  turn.div.dataset.messageId = messageId;
  if (old) old.replaceWith(turn.div);
  $("#send").disabled = true;
  // After a dropped stream the page already says so; it goes on saying why it follows.
  if ($("#notice").textContent.startsWith("The connection to the reply closed")) {
    notice("The connection to the reply closed before it ended. The turn goes on in the service; this reply is still being written, following it live.", "info");
  } else notice("This reply is still being written; following it live.", "info");
  let after = 0, ended = false, id = messageId;
  const ticker = setInterval(() => { if (turn.progress) showWait(turn); }, 500);
  try {
    while (!ended && cid === ui.cid && !controller.signal.aborted) {
      try {
        const res = await fetch(`/api/conversations/${cid}/live?message_id=${id}&after=${after}`, { signal: controller.signal });
        if (!res.ok) {
          let data = {};
          try { data = await res.json(); } catch (e) { data = {}; }
          notice(data.error || `The console answered ${res.status}.`);
          break;
        }
        await readEvents(res, (ev) => {
          if (ev.offset) after = ev.offset;
          if (ev.type === "ended") { ended = true; return; }
          if (ev.type === "meta") { ui.taskId = ev.task_id; $("#stop").hidden = false; }
          if (ev.type === "record") { id = turn.div.dataset.messageId = ev.message_id; return; }
          onEvent(turn, ev);
        });
      } catch (e) {
        if (e.name === "AbortError") break;
        await sleep(500);  // a dropped stream: again, after the last event seen
      }
    }
  } finally {
    clearInterval(ticker);
    ui.watching = false;
    ui.watchAbort = null;
    ui.taskId = "";
    $("#stop").hidden = true;
    $("#send").disabled = false;
  }
  if (cid !== ui.cid) return;
  notice("");
  try { await loadHistory(false); } catch (e) { notice(e.message); }
  loadInspector();
  loadConversations(false).catch(() => {});
}

// ---------------------------------------------------------------- inspector

function kv(rows) {
  const table = el("table", "kv");
  for (const [k, v, field] of rows) {
    const tr = el("tr");
    const td = el("td", "", String(v));
    if (field) td.dataset.field = field;
    tr.append(el("td", "", k), td);
    table.append(tr);
  }
  return table;
}

async function loadInspector() {
  const body = $("#inspector-body");
  if (!ui.cid) { body.replaceChildren(el("p", "muted", "Pick or start a conversation.")); return; }
  const cid = ui.cid;
  let data;
  try { data = await api("GET", `/api/conversations/${cid}/inspector`); }
  catch (e) { body.replaceChildren(el("p", "muted", e.message)); return; }
  if (cid !== ui.cid) return data;
  const parts = [el("h3", "", "AgentState")];
  const s = data.state;
  if (!s) parts.push(el("p", "muted", "No state saved yet."));
  else {
    parts.push(kv([
      ["version", s.version, "version"],
      ["size", `${s.size_bytes.toLocaleString()} bytes`, "size"],
      ["messages in context", s.messages.length, "context-count"],
      ["pending calls", s.pending_calls.length ? s.pending_calls.map((p) => p.name).join(", ") : "none", "pending"],
      ["saved (update time)", s.update_time ? new Date(s.update_time).toLocaleString() : "", "saved"],
    ]));
    parts.push(el("h3", "", "Summary"));
    const summary = el("div", s.summary ? "summary" : "muted", s.summary || "none (not compacted)");
    summary.dataset.field = "summary";
    parts.push(summary);
    parts.push(el("h3", "", "Context (what the model sees)"));
    const ol = el("ol", "context");
    for (const m of s.messages) {
      // Every message with the contents of its blocks (folded; a click opens one).
      const li = el("li");
      const more = el("details", "message");
      more.append(el("summary", "", `${m.role}: ${m.blocks.join(", ") || "(empty)"}`));
      for (const b of m.contents) {
        const block = el("div", "block");
        block.append(el("div", "label", b.label), el("pre", "", b.text || "(empty)"));
        more.append(block);
      }
      if (m.usage) more.append(el("div", "muted", `tokens: ${JSON.stringify(m.usage)}`));
      li.append(more);
      ol.append(li);
    }
    parts.push(ol);
    const raw = el("details", "raw");
    raw.dataset.field = "raw";
    raw.append(el("summary", "", `Raw JSON (version ${s.version})`), el("pre", "", s.raw));
    parts.push(raw);
  }
  parts.push(el("h3", "", `Compactions (${data.compactions.length})`));
  if (!data.compactions.length) parts.push(el("p", "muted", "none"));
  else {
    const table = el("table", "compactions");
    table.append(el("tr"));
    table.firstChild.append(el("th", "", "when"), el("th", "", "messages"), el("th", "", "tokens"), el("th", "", "why"));
    for (const c of data.compactions) {
      const tr = el("tr");
      tr.append(
        el("td", "", c.create_time ? new Date(c.create_time).toLocaleTimeString() : ""),
        el("td", "", `${c.messages_before} → ${c.messages_after}`),
        el("td", "", `${c.tokens_before} → ${c.tokens_after}`),
        el("td", "", c.reason),
      );
      table.append(tr);
    }
    parts.push(table);
  }
  parts.push(el("h3", "", "Run lease"));
  const l = data.lease;
  const lease = l
    ? kv([
        ["state", l.lapsed ? "lapsed (its turn died; the next turn takes it over)" : (l.stop_requested ? "running, stop requested" : "running"), "lease"],
        ["task", l.task_id],
        ["held by", l.holder],
        ["since", l.since ? new Date(l.since).toLocaleTimeString() : "?"],
        ["until", new Date(l.expires).toLocaleTimeString()],
      ])
    : kv([["state", "free: no turn is running", "lease"]]);
  parts.push(lease);
  body.replaceChildren(...parts);
  return data;
}

// ---------------------------------------------------------------- turns

function scrollDown() {
  const box = $("#messages");
  box.scrollTop = box.scrollHeight;
}

function liveTurn() {
  const div = el("div", "msg assistant live");
  $("#messages").append(div);
  scrollDown();
  return { div, text: null, raw: "", thinking: null, tools: {}, wait: null, lastEvent: Date.now(), progress: null };
}

// A long silence from the model: time elapsed (and the attempt, once the agent says),
// with Retry. Drawn from the agent's progress events and the page's own clock.
function showWait(turn) {
  if (!turn.wait) {
    turn.wait = el("div", "wait");
    turn.wait.dataset.field = "wait";
    const words = el("span", "words");
    const retry = el("button", "retry", "Retry");
    retry.title = "Stop this turn and ask the same question again";
    retry.addEventListener("click", () => {
      retry.disabled = true;
      ui.retry = ui.question;
      stopTurn();
    });
    turn.wait.append(words, retry);
    turn.div.append(turn.wait);
  }
  const p = turn.progress;
  const seconds = Math.round((Date.now() - (p ? p.since : turn.lastEvent)) / 1000);
  let words = `Waiting for the model… ${seconds} s`;
  if (p && p.attempts > 1) words += `, attempt ${p.attempt} of ${p.attempts}`;
  if (p && p.note) words += ` (${p.note})`;
  turn.wait.querySelector(".words").textContent = words;
}

function hideWait(turn) {
  if (turn.wait) { turn.wait.remove(); turn.wait = null; }
  turn.progress = null;
}

function onEvent(turn, ev) {
  turn.lastEvent = Date.now();
  if (ev.type !== "progress") hideWait(turn);
  if (ev.type === "meta") {
    ui.taskId = ev.task_id;
    // The turn has started: the question is in the service now, the box may be cleared.
    if ($("#question").value === ui.question) $("#question").value = "";
    note("");
    if (ev.conversation_id !== ui.cid) {
      ui.cid = ev.conversation_id;
      history.replaceState(null, "", `#/c/${ui.cid}`);
      loadConversations(false)
        .then(() => { if (ui.titles[ui.cid]) $("#chat-title").textContent = ui.titles[ui.cid]; })
        .catch(() => {});
    }
    loadInspector();
  } else if (ev.type === "progress") {
    turn.progress = { since: Date.now() - ev.elapsed_ms, attempt: ev.attempt, attempts: ev.attempts, note: ev.note };
    showWait(turn);
  } else if (ev.type === "message") {
    if (ev.kind === "thinking") {
      if (!turn.thinking) { turn.thinking = el("div", "thinking", ""); turn.div.append(turn.thinking); turn.text = null; }
      turn.thinking.textContent += ev.delta;
    } else {
      if (!turn.text) { turn.text = el("div", ev.kind === "error" ? "text error" : "text", ""); turn.div.append(turn.text); turn.thinking = null; turn.raw = ""; }
      turn.raw += ev.delta;
      turn.text.replaceChildren(markdown(turn.raw));
    }
    scrollDown();
  } else if (ev.type === "block") {
    let row = turn.tools[ev.call_id];
    const fresh = toolRow(ev.tool_name, ev.arguments, ev.words + (ev.summary ? `: ${ev.summary}` : ""), "", "");
    if (!row) {
      turn.div.append(fresh);
      turn.text = turn.thinking = null;
    } else row.replaceWith(fresh);
    turn.tools[ev.call_id] = fresh;
  } else if (ev.type === "hint") {
    turn.div.append(el("div", "status", ev.text));
  } else if (ev.type === "confirm") {
    turn.div.append(renderCard(ev.card, ui.cid));
    scrollDown();
  } else if (ev.type === "cancel") {
    turn.div.append(el("div", "status", "Stopped before it finished."));
  } else if (ev.type === "error") {
    notice(ev.message);
  }
}

// The words beside the composer: why a question was not sent (it stays in the box).
function note(text) {
  const box = $("#composer-note");
  box.hidden = !text;
  box.textContent = text || "";
}

async function stopTurn() {
  if (!ui.taskId) return;
  try { await api("POST", "/api/stop", { task_id: ui.taskId }); } catch (e) { notice(e.message); }
}

async function readEvents(res, onEach) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const chunk = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      if (chunk.startsWith("data: ")) onEach(JSON.parse(chunk.slice(6)));
    }
  }
}

async function runStream(path, body) {
  ui.streaming = true;
  clearTimeout(ui.pollTimer);
  $("#send").disabled = true;
  $("#stop").hidden = false;
  const controller = new AbortController();
  ui.abort = controller;
  const turn = liveTurn();
  const ticker = setInterval(() => {
    if (turn.progress || Date.now() - turn.lastEvent > 3000) showWait(turn);
  }, 500);
  let done = false, failed = false, started = false;
  try {
    const res = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) {
      let data = {};
      try { data = await res.json(); } catch (e) { data = {}; }
      throw new Error(data.error || `The console answered ${res.status}.`);
    }
    await readEvents(res, (ev) => {
      if (ev.type === "meta") started = true;
      if (ev.type === "error") {
        failed = true;
        // Refused before the turn started: the question stays in the box, with the reason.
        if (!started && ui.question) { $("#question").value = ui.question; note(`Not sent: ${ev.message} Your question is kept above.`); }
      }
      if (ev.type === "done") done = true;
      onEvent(turn, ev);
    });
  } catch (e) {
    if (e.name !== "AbortError") {
      notice(e.message); failed = true;
      if (!started && ui.question) { $("#question").value = ui.question; note(`Not sent: ${e.message} Your question is kept above.`); }
    }
  } finally {
    clearInterval(ticker);
    hideWait(turn);
    ui.streaming = false;
    ui.abort = null;
    ui.taskId = "";
    ui.question = "";
    $("#send").disabled = false;
    $("#stop").hidden = true;
  }
  if (!done && !failed) {
    notice("The connection to the reply closed before it ended. The turn goes on in the service; showing it from the saved records.", "info");
  } else if (!failed) {
    notice("");
  }
  if (ui.cid) {
    if (!done && !failed) resumeFromRecords();
    else {
      try { await loadHistory(false); } catch (e) { notice(e.message); }
      loadInspector();
    }
    loadConversations(false).catch(() => {});
  } else {
    turn.div.remove();
  }
  if (ui.retry) { const again = ui.retry; ui.retry = ""; send(again); }
}

function confirmCard(cid, messageId, approved) {
  if (ui.streaming) { notice("Wait for the current reply to finish."); return; }
  return runStream("/api/confirm", { conversation_id: cid, message_id: messageId, approved });
}

function openCardShown() {
  return [...document.querySelectorAll("#messages .card button.approve")].some((b) => !b.disabled);
}

async function send(question) {
  if (!question.trim()) { note("Type a question first."); return; }
  // Refused here: the question stays in the box and the reason shows beside it.
  if (ui.streaming || ui.watching) { note("Not sent: a reply is still being written. Your question is kept; send it when the reply ends."); return; }
  if (openCardShown()) { note("Not sent: answer the open confirmation card first. Your question is kept."); return; }
  notice("");
  note("");
  const user = el("div", "msg user");
  user.append(el("div", "text", question));
  $("#messages").append(user);
  ui.question = question;
  await runStream("/api/chat", { conversation_id: ui.cid, question });
}

// ---------------------------------------------------------------- navigation

function go(cid) {
  location.hash = cid ? `#/c/${cid}` : "#/";
}

async function route() {
  const match = location.hash.match(/^#\/c\/(.*)$/);
  const cid = match ? decodeURIComponent(match[1]) : "";
  if (cid === ui.cid && $("#messages").childElementCount) return;
  if (ui.streaming) return;
  if (ui.watchAbort) ui.watchAbort.abort();  // another conversation: stop following this one
  ui.cid = cid;
  ui.nextMessages = "";
  for (const li of document.querySelectorAll("#conversations li")) li.classList.toggle("current", li.dataset.conversationId === cid);
  $("#messages").replaceChildren();
  ui.timelines = {};
  ui.shownTimeline = "";
  renderTimeline();
  $("#more-messages").hidden = true;
  $("#chat-title").textContent = cid ? (ui.titles[cid] || `Conversation ${cid}`) : "New conversation";
  notice("");
  note("");
  $("#send").disabled = false;
  if (!cid) { loadInspector(); return; }
  try {
    const data = await loadHistory(false);
    if (!data.records.length && await showFramework(cid)) return;
    const seen = await loadInspector();
    // A turn still running (its record on this page, or the lease held): attach to it.
    const running = data.records.find((r) => r.streaming);
    if (running) watchTurn(cid, running.message_id);
    else if (seen && seen.lease && !seen.lease.lapsed) watchTurn(cid, "");
  } catch (e) {
    notice(e.message);
    $("#inspector-body").replaceChildren(el("p", "muted", "Nothing to inspect."));
  }
}

async function firstLoad() {
  let user = "";
  try {
    const me = await api("GET", "/api/me");
    user = me.user;
    ui.traceUrl = me.trace_url_template || "";
    $("#user").textContent = "signed in as " + user;
    await loadConversations(false);
    $("#user").classList.remove("offline");
    return true;
  } catch (e) {
    // Said, never a blank page: who is signed in (if anyone) and why nothing loaded.
    $("#user").textContent = user ? `signed in as ${user} · not connected` : "not signed in";
    $("#user").classList.add("offline");
    const box = $("#load-error");
    box.hidden = false;
    box.querySelector(".words").textContent = `The console could not load your conversations: ${e.message}`;
    return false;
  }
}

async function start() {
  const composer = $("#composer");
  const pending = composer.dataset.pending === "1" ? $("#question").value : "";
  const ok = await firstLoad();
  $("#load-retry").addEventListener("click", async () => {
    if (await firstLoad()) { $("#load-error").hidden = true; await route(); }
  });
  $("#new-chat").addEventListener("click", () => go(""));
  $("#search-title").addEventListener("input", searchChanged);
  $("#more-conversations").addEventListener("click", () => loadConversations(true).catch((e) => notice(e.message)));
  $("#search").addEventListener("submit", (e) => { e.preventDefault(); loadConversations(false).catch((err) => notice(err.message)); });
  $("#search-status").addEventListener("change", () => loadConversations(false).catch((e) => notice(e.message)));
  $("#more-messages").addEventListener("click", () => loadHistory(true).catch((e) => notice(e.message)));
  $("#delete-selected").addEventListener("click", () => deleteConversations(selectedIds()));
  composer.addEventListener("submit", (e) => { e.preventDefault(); send($("#question").value); });
  $("#question").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send($("#question").value); }
  });
  $("#stop").addEventListener("click", stopTurn);
  window.addEventListener("hashchange", route);
  await route();
  // Typed and sent before this script ran (a plain form post): send it now.
  if (pending && ok) {
    delete composer.dataset.pending;
    history.replaceState(null, "", location.pathname + location.hash);
    send(pending);
  }
}

// For tests and curious operators: drop the running stream as a network failure would.
// taskId is set once the agent has started the turn (its first event).
window.agentstateConsole = {
  dropStream: () => ui.abort && ui.abort.abort(),
  taskId: () => ui.taskId,
  markdown: (text) => markdown(text),  // the renderer alone, for its hostile-input test
};

start();
