// agentstate console: plain JS, no build step. Talks only to this console's /api.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, cls, text) => {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
};

const ui = {
  cid: "",            // current conversation ("" = a new one)
  streaming: false,
  taskId: "",
  abort: null,        // the running stream's AbortController
  nextConversations: "",
  nextMessages: "",
  titles: {},
  pollTimer: null,
};

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = {};
  try { data = await res.json(); } catch (e) { data = {}; }
  if (!res.ok) throw new Error(data.error || `The console answered ${res.status}.`);
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
  // The search runs on the server: a title prefix and a status (issue 23).
  const query = new URLSearchParams();
  if (token) query.set("page_token", token);
  const q = $("#search-title").value.trim();
  if (q) query.set("q", q);
  const status = $("#search-status").value;
  if (status) query.set("status", status);
  const data = await api("GET", "/api/conversations" + (query.size ? `?${query}` : ""));
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
    const title = el("span", "title", c.title || "(untitled)");
    title.title = c.title;
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
  updateBatchButton();
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
    : `${ids.length} conversations`;
  if (!confirm(`Delete ${what}? Its messages and its agent state are removed for good.`)) return;
  try {
    if (ids.length === 1) await api("DELETE", `/api/conversations/${ids[0]}`);
    else await api("POST", "/api/conversations/batch-delete", { conversation_ids: ids });
    notice(ids.length === 1 ? "Deleted." : `Deleted ${ids.length} conversations.`, "info");
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

function renderRecord(view, cid) {
  const div = el("div", `msg ${view.role}` + (view.error ? " error" : ""));
  div.dataset.messageId = view.message_id;
  for (const item of view.items) {
    if (item.kind === "text") div.append(el("div", "text", item.text));
    else if (item.kind === "thinking") div.append(el("div", "thinking", item.text));
    else if (item.kind === "tool") {
      const row = el("div", "tool");
      row.append(el("span", "", `⚙ ${item.tool_name} ${JSON.stringify(item.arguments)} · `), el("span", "words", item.words));
      div.append(row);
    }
  }
  if (view.card) div.append(renderCard(view.card, cid));
  // A failed turn: what was streamed stays as a partial answer, then the failure's sentence.
  if (view.partial) div.append(el("div", "status partial", "(partial answer: the turn did not finish)"));
  if (view.error_text) div.append(el("div", "error-text", view.error_text));
  if (view.status_words) div.append(el("div", "status", view.status_words));
  if (view.role === "user" && !view.items.length && !view.card) return null;  // a card's answer
  return div;
}

async function loadHistory(more) {
  const cid = ui.cid;
  const token = more ? ui.nextMessages : "";
  const data = await api("GET", `/api/conversations/${cid}/messages` + (token ? `?page_token=${encodeURIComponent(token)}` : ""));
  if (cid !== ui.cid) return data;
  const box = $("#messages");
  if (!more) box.replaceChildren();
  for (const view of data.records) {
    const node = renderRecord(view, cid);
    if (node) box.append(node);
  }
  ui.nextMessages = data.next_page_token;
  $("#more-messages").hidden = !data.next_page_token;
  if (!more) scrollDown();
  return data;
}

// A turn still writing its records (a reload, a closed stream): show it from the records.
function resumeFromRecords() {
  clearTimeout(ui.pollTimer);
  const cid = ui.cid;
  const tick = async () => {
    if (cid !== ui.cid || ui.streaming) return;
    try {
      let data = await loadHistory(false);
      while (data.next_page_token && cid === ui.cid) data = await loadHistory(true);
      await loadInspector();
      if (data.records.some((r) => r.streaming)) {
        notice("A reply is still being written; it shows here when it is saved.", "info");
        ui.pollTimer = setTimeout(tick, 700);
      } else {
        notice("");
      }
    } catch (e) { notice(e.message); }
  };
  tick();
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
  if (cid !== ui.cid) return;
  const parts = [el("h3", "", "AgentState")];
  const s = data.state;
  if (!s) parts.push(el("p", "muted", "No state saved yet."));
  else {
    parts.push(kv([
      ["version", s.version, "version"],
      ["size", `${s.size_bytes.toLocaleString()} bytes`, "size"],
      ["messages in context", s.messages.length, "context-count"],
      ["pending calls", s.pending_calls.length ? s.pending_calls.map((p) => p.name).join(", ") : "none", "pending"],
      ["saved", s.update_time ? new Date(s.update_time).toLocaleString() : "", "saved"],
    ]));
    parts.push(el("h3", "", "Summary"));
    const summary = el("div", s.summary ? "summary" : "muted", s.summary || "none (not compacted)");
    summary.dataset.field = "summary";
    parts.push(summary);
    parts.push(el("h3", "", "Context (what the model sees)"));
    const ol = el("ol", "context");
    for (const m of s.messages) ol.append(el("li", "", `${m.role}: ${m.blocks.join(", ") || "(empty)"}`));
    parts.push(ol);
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
  return { div, text: null, thinking: null, tools: {} };
}

function onEvent(turn, ev) {
  if (ev.type === "meta") {
    ui.taskId = ev.task_id;
    if (ev.conversation_id !== ui.cid) {
      ui.cid = ev.conversation_id;
      history.replaceState(null, "", `#/c/${ui.cid}`);
      loadConversations(false)
        .then(() => { if (ui.titles[ui.cid]) $("#chat-title").textContent = ui.titles[ui.cid]; })
        .catch(() => {});
    }
    loadInspector();
  } else if (ev.type === "message") {
    if (ev.kind === "thinking") {
      if (!turn.thinking) { turn.thinking = el("div", "thinking", ""); turn.div.append(turn.thinking); turn.text = null; }
      turn.thinking.textContent += ev.delta;
    } else {
      if (!turn.text) { turn.text = el("div", ev.kind === "error" ? "text error" : "text", ""); turn.div.append(turn.text); turn.thinking = null; }
      turn.text.textContent += ev.delta;
    }
    scrollDown();
  } else if (ev.type === "block") {
    let row = turn.tools[ev.call_id];
    if (!row) {
      row = el("div", "tool");
      row.append(el("span", "", `⚙ ${ev.tool_name} ${JSON.stringify(ev.arguments)} · `), el("span", "words", ""));
      turn.tools[ev.call_id] = row;
      turn.div.append(row);
      turn.text = turn.thinking = null;
    }
    row.querySelector(".words").textContent = ev.words + (ev.summary ? `: ${ev.summary}` : "");
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

async function runStream(path, body) {
  ui.streaming = true;
  clearTimeout(ui.pollTimer);
  $("#send").disabled = true;
  $("#stop").hidden = false;
  const controller = new AbortController();
  ui.abort = controller;
  const turn = liveTurn();
  let done = false, failed = false;
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
        if (!chunk.startsWith("data: ")) continue;
        const ev = JSON.parse(chunk.slice(6));
        if (ev.type === "error") failed = true;
        if (ev.type === "done") done = true;
        onEvent(turn, ev);
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") { notice(e.message); failed = true; }
  } finally {
    ui.streaming = false;
    ui.abort = null;
    ui.taskId = "";
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
      try { let d = await loadHistory(false); while (d.next_page_token && ui.cid) d = await loadHistory(true); } catch (e) { notice(e.message); }
      loadInspector();
    }
    loadConversations(false).catch(() => {});
  } else {
    turn.div.remove();
  }
}

function confirmCard(cid, messageId, approved) {
  if (ui.streaming) { notice("Wait for the current reply to finish."); return; }
  return runStream("/api/confirm", { conversation_id: cid, message_id: messageId, approved });
}

async function send(question) {
  if (!question.trim() || ui.streaming) return;
  notice("");
  const user = el("div", "msg user");
  user.append(el("div", "text", question));
  $("#messages").append(user);
  $("#question").value = "";
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
  ui.cid = cid;
  ui.nextMessages = "";
  for (const li of document.querySelectorAll("#conversations li")) li.classList.toggle("current", li.dataset.conversationId === cid);
  $("#messages").replaceChildren();
  $("#more-messages").hidden = true;
  $("#chat-title").textContent = cid ? (ui.titles[cid] || `Conversation ${cid}`) : "New conversation";
  notice("");
  if (!cid) { loadInspector(); return; }
  try {
    const data = await loadHistory(false);
    loadInspector();
    if (data.records.some((r) => r.streaming)) resumeFromRecords();
  } catch (e) {
    notice(e.message);
    $("#inspector-body").replaceChildren(el("p", "muted", "Nothing to inspect."));
  }
}

async function start() {
  try {
    $("#user").textContent = "signed in as " + (await api("GET", "/api/me")).user;
    await loadConversations(false);
  } catch (e) { notice(e.message); }
  $("#new-chat").addEventListener("click", () => go(""));
  $("#more-conversations").addEventListener("click", () => loadConversations(true).catch((e) => notice(e.message)));
  $("#search").addEventListener("submit", (e) => { e.preventDefault(); loadConversations(false).catch((err) => notice(err.message)); });
  $("#search-status").addEventListener("change", () => loadConversations(false).catch((e) => notice(e.message)));
  $("#more-messages").addEventListener("click", () => loadHistory(true).catch((e) => notice(e.message)));
  $("#delete-selected").addEventListener("click", () => deleteConversations(selectedIds()));
  $("#composer").addEventListener("submit", (e) => { e.preventDefault(); send($("#question").value); });
  $("#question").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send($("#question").value); }
  });
  $("#stop").addEventListener("click", async () => {
    if (!ui.taskId) return;
    try { await api("POST", "/api/stop", { task_id: ui.taskId }); } catch (e) { notice(e.message); }
  });
  window.addEventListener("hashchange", route);
  await route();
}

// For tests and curious operators: drop the running stream as a network failure would.
// taskId is set once the agent has started the turn (its first event).
window.agentstateConsole = {
  dropStream: () => ui.abort && ui.abort.abort(),
  taskId: () => ui.taskId,
};

start();
