"""The web console in a real browser: Debian's chromium driven by Selenium, against real
processes (state service on PostgreSQL, agent service with the order demo, the console).

Each test signs in as its own user through the trusted-proxy header (set with the
DevTools protocol, as an authenticating proxy would), so the tests share one browser and
one set of services. Screenshots go to a temporary directory (printed at the end of the
module); docs/console.png, the README's, is taken by the worked example only when asked
(`./run docs`, which passes --docs-screenshot).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentstate.dev.processes import ServiceProcess
from tests.support.state_process import StateServices, on_postgres

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
QUESTION = "我买的那块Apple Watch还没发货的话，帮我取消吧，不想要了。"
STATUS_QUESTION = "我的订单88235现在什么状态？"
USER_HEADER = "X-Forwarded-User"
STATE_ADDRESS = [""]  # the module's state service, once console_url has started it
# Words the page must never show: internal status names of records, blocks and cards.
INTERNAL_NAMES = [
    "AWAITING_CONFIRM",
    "STREAMING",
    "INTERRUPTED",
    "MESSAGE_STATUS",
    "asking",
    "denied",
    "allowed",
    "TOOL_CALL_STATUS",
]

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("CI"):
        pytest.fail("CI: chromium/chromedriver missing (scripts/install_browser.sh)", pytrace=False)
    pytest.skip(
        "chromium + chromium-driver not installed (scripts/install_browser.sh installs them)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def console_url(database_url: str) -> Iterator[str]:
    """State service, agent service (order demo, slowed a little, small context budget so a
    long turn compacts) and the console, each its own process on loopback."""
    services: list[ServiceProcess] = []
    with StateServices() as states:
        try:
            state_address = states.serve(on_postgres(database_url))
            STATE_ADDRESS[0] = state_address  # the framework sessions' test writes there
            agent = ServiceProcess(
                "agentstate.agent_service",
                {
                    "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
                    "AGENT_AUTH_MODE": "dev-header",  # the console passes agentstate-user-id
                    "AGENT_STATE_ADDRESS": state_address,
                    "AGENT_PROFILE": "order_demo",
                    "ORDERS_DATABASE_URL": "",  # in memory, seeded per user
                    "AGENT_SCRIPTED_STEP_DELAY_SECONDS": "0.4",
                    "AGENT_CONTEXT_BUDGET_TOKENS": "2000",
                    "AGENT_LEASE_RENEW_SECONDS": "0.2",
                },
            )
            services.append(agent)
            agent_address = agent.wait_ready()
            console = ServiceProcess(
                "agentstate.console",
                {
                    "CONSOLE_LISTEN_ADDRESS": "127.0.0.1:0",
                    "CONSOLE_AGENT_ADDRESS": agent_address,
                    "CONSOLE_STATE_ADDRESS": state_address,
                    "CONSOLE_USER_HEADER": USER_HEADER,
                    "CONSOLE_DEV_USER": "",
                    "CONSOLE_HISTORY_PAGE_SIZE": "2",
                    "CONSOLE_TRACE_URL_TEMPLATE": "http://traces.example/trace/{trace_id}",
                },
            )
            services.append(console)
            yield console.wait_ready()
        finally:
            codes = [s.terminate() for s in reversed(services)]
            assert codes == [0] * len(codes), "\n".join(s.output for s in services)


@pytest.fixture(scope="module")
def browser(console_url: str) -> Iterator[WebDriver]:
    """One headless chromium for the module; it quits before the services stop (an open
    keep-alive connection would hold the console's shutdown)."""
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="agentstate-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Network.enable", {})
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where the pages' screenshots go: a temporary directory, never the tree."""
    folder = tmp_path_factory.mktemp("console-screenshots")
    yield folder
    print(f"\nconsole screenshots: {folder}")


class Page:
    """The console as one user sees it."""

    def __init__(self, driver: WebDriver, base: str, user: str, screenshots: Path) -> None:
        self.driver, self.base, self.user = driver, base, user
        self.screenshots = screenshots
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {USER_HEADER: user}})

    def open(self, conversation_id: str = "") -> None:
        self.driver.get("about:blank")  # a fresh page load, even for the URL already open
        self.driver.get(f"{self.base}/#/c/{conversation_id}" if conversation_id else self.base)
        self.wait(lambda: self.user in self.text("#user"))

    def wait(self, condition: Callable[[], Any], timeout: float = 15) -> Any:
        # An element read while the page redraws it (or reloads, after a plain form post) is
        # stale: the condition is asked again, as for one not there yet.
        return WebDriverWait(
            self.driver,
            timeout,
            poll_frequency=0.05,
            ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
        ).until(lambda _: condition())

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        try:
            return self.find(css).text
        except (NoSuchElementException, StaleElementReferenceException):
            return ""  # not there (yet), or redrawn while read: the caller waits again

    def ask(self, question: str) -> None:
        box = self.find("#question")
        box.clear()
        box.send_keys(question)
        self.find("#send").click()

    def open_card(self) -> Any:
        """The open confirmation card, found by DOM (not by pixels), once the turn is over
        (the page then redraws it from the records)."""
        self.idle()
        return self.wait(
            lambda: next(
                (
                    c
                    for c in self.all(".card")
                    if c.find_elements(By.CSS_SELECTOR, "button.approve")
                ),
                None,
            )
        )

    def idle(self) -> None:
        self.wait(
            lambda: (
                not self.find("#send").get_attribute("disabled")
                and not self.all("#messages .msg.live")
            ),
            timeout=20,
        )

    def conversation_id(self) -> str:
        self.wait(lambda: self.driver.current_url.split("#/c/")[-1].isdigit())
        return self.driver.current_url.split("#/c/")[-1]

    def record_fetches(self) -> None:
        """Keep every JSON body the page POSTs to /api/confirm."""
        self.driver.execute_script(
            """window.__confirms = [];
            const real = window.fetch;
            window.fetch = (url, init) => {
              if (String(url).endsWith('/api/confirm'))
                window.__confirms.push(JSON.parse(init.body));
              return real(url, init);
            };"""
        )

    def confirms(self) -> list[dict[str, Any]]:
        return list(self.driver.execute_script("return window.__confirms"))

    def show_all_history(self) -> None:
        while self.find("#more-messages").is_displayed():
            count = len(self.all("#messages .msg"))
            self.find("#more-messages").click()
            self.wait(functools.partial(self._more_than, count))

    def _more_than(self, count: int) -> bool:
        return len(self.all("#messages .msg")) > count

    def screenshot(self, name: str) -> Path:
        path = self.screenshots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def listed(self) -> list[str]:
        """The conversation ids the list shows, read in one go (it may be redrawn)."""
        return list(
            self.driver.execute_script(
                "return [...document.querySelectorAll('#conversations li')]"
                ".map((li) => li.dataset.conversationId)"
            )
        )

    def no_internal_names(self) -> None:
        shown = self.text("#chat")
        assert not [n for n in INTERNAL_NAMES if n in shown], shown


def api(base: str, user: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A request as the proxy would forward it (JSON, or a turn stream's events)."""
    request = urllib.request.Request(
        base + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={USER_HEADER: user, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read().decode())
    if raw.startswith("data: "):
        return status, [
            json.loads(line[6:]) for line in raw.split("\n\n") if line.startswith("data: ")
        ]
    return status, json.loads(raw)


def chat(base: str, user: str, question: str, conversation_id: str = "") -> list[dict[str, Any]]:
    status, events = api(
        base, user, "POST", "/api/chat", {"question": question, "conversation_id": conversation_id}
    )
    assert status == 200 and events[-1]["type"] == "done", events
    return list(events)


def new_user(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_the_worked_example_ask_card_cancel_reply(
    browser: WebDriver, console_url: str, screenshots: Path, request: pytest.FixtureRequest
) -> None:
    page = Page(browser, console_url, new_user("alice"), screenshots)
    page.open()
    page.record_fetches()
    page.ask(QUESTION)
    card = page.open_card()
    message_id = card.get_attribute("data-message-id")
    assert "88235" in card.text and message_id
    page.screenshot("01-card")
    conversation_id = page.conversation_id()
    card.find_element(By.CSS_SELECTOR, "button.cancel").click()
    page.wait(lambda: "Declined by you" in page.text(".card .outcome"), timeout=20)
    page.idle()
    # The confirm request carried exactly the three fields.
    assert page.confirms() == [
        {
            "conversation_id": conversation_id,
            "message_id": message_id,
            "approved": False,
        }
    ]
    reply = page.all("#messages .msg.assistant")[-1].text
    assert "88235" in reply and "3378.00" in reply
    # The reply's markdown list is rendered as one.
    assert len(page.all("#messages .msg.assistant .md ul li")) >= 3
    # The card said what would run, from the call's input.
    assert "cancel_order" in page.text("[data-field=will-run]")
    assert "orderNo" in page.text(".card dl.arguments")
    # The inspector: block contents and the raw JSON, with the version.
    page.find("#inspector details.message summary").click()
    assert page.text("#inspector details.message pre")
    raw = page.find("[data-field=raw]")
    raw.find_element(By.CSS_SELECTOR, "summary").click()
    assert '"cancel_order"' in raw.text and page.text("[data-field=version]") in raw.text
    # The cancel_order call, told by the outcome_text the agent wrote on the real record.
    assert "你在确认卡片上点了取消，操作没有执行。" in page.text("#messages")  # its detail
    _, history = api(
        console_url, page.user, "GET", f"/api/conversations/{conversation_id}/messages"
    )
    records = history["records"]
    (declined,) = [i for r in records for i in r["items"] if i.get("tool_name") == "cancel_order"]
    # The status word is the console's language; the agent's sentence is its detail.
    assert declined["words"] == "Declined by you: not run"
    assert declined["detail"] == "你在确认卡片上点了取消，操作没有执行。"
    page.wait(lambda: page.text("[data-field=context-count]") == "8")
    assert page.text("[data-field=pending]") == "none"
    assert "free" in page.text("[data-field=lease]")
    page.no_internal_names()
    shown = page.screenshot("00-worked-example")
    docs_screenshot = request.config.getoption("docs_screenshot")
    if docs_screenshot:  # ./run docs: the README's picture of the console
        shutil.copyfile(shown, docs_screenshot)
    # History pages (2 records a page here): a reload opens at the newest page (the
    # reply), and "Show earlier messages" adds the ones before it.
    page.open(conversation_id)
    page.wait(lambda: page.find("#more-messages").is_displayed())
    assert page.all("#messages .msg.assistant")[-1].text == reply
    assert not page.all("#messages .msg.user")  # the question is on the page before
    page.show_all_history()
    assert page.all("#messages .msg.user")[0].text.startswith(QUESTION)
    assert page.all("#messages .msg.assistant")[-1].text == reply
    assert "Declined by you" in page.text(".card .outcome")


def test_approve_on_a_fresh_conversation_once_despite_a_double_click(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    user = new_user("bob")
    page = Page(browser, console_url, user, screenshots)
    page.open()
    page.record_fetches()
    page.ask(QUESTION)
    card = page.open_card()
    message_id = card.get_attribute("data-message-id")
    conversation_id = page.conversation_id()
    ActionChains(browser).double_click(
        card.find_element(By.CSS_SELECTOR, "button.approve")
    ).perform()
    page.wait(lambda: "Approved by you" in page.text(".card .outcome"), timeout=20)
    page.idle()
    assert len(page.confirms()) == 1  # the second click found the buttons disabled
    page.screenshot("02-approved")
    _, before = api(console_url, user, "GET", f"/api/conversations/{conversation_id}/messages")
    # The approved call, told by the outcome_text the agent wrote on its record.
    (ran,) = [
        i for r in before["records"] for i in r["items"] if i.get("tool_name") == "cancel_order"
    ]
    assert (ran["words"], ran["detail"]) == ("Done", "已执行完成。")
    assert "订单 88235 已取消" in ran["output"]  # replay shows the tool's output
    assert "cancel_order" in page.text("#messages") and "Done" in page.text("#messages")
    # A second answer to the same card (another tab, a replayed request): refused, no change.
    status, events = api(
        console_url,
        user,
        "POST",
        "/api/confirm",
        {"conversation_id": conversation_id, "message_id": message_id, "approved": True},
    )
    assert status == 200 and events[-1] == {
        "type": "error",
        "message": "This card was already answered. Nothing was changed.",
        "code": "FAILED_PRECONDITION",
    }
    _, after = api(console_url, user, "GET", f"/api/conversations/{conversation_id}/messages")
    assert after == before


def test_a_reload_mid_stream_resumes_from_the_records(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    page = Page(browser, console_url, new_user("carol"), screenshots)
    page.open()
    page.ask(QUESTION)
    conversation_id = page.conversation_id()
    page.wait(lambda: page.text("#messages .msg.live"))  # the answer has started streaming
    browser.refresh()
    # The page comes back from the records: the turn is still running there.
    page.wait(lambda: "still being written" in page.text("#notice"), timeout=5)
    page.wait(lambda: page.text("[data-field=lease]") == "running", timeout=5)  # the inspector
    page.screenshot("03-reloaded-mid-stream")
    card = page.open_card()
    page.wait(lambda: page.find("#notice").is_displayed() is False)
    assert page.conversation_id() == conversation_id
    assert len(page.all(".card")) == 1 and "88235" in card.text
    # A closed stream (the connection drops mid-turn) says so and also resumes from the records.
    card.find_element(By.CSS_SELECTOR, "button.cancel").click()
    # Dropped once the agent has started the turn (before that, nothing would have happened).
    page.wait(lambda: browser.execute_script("return window.agentstateConsole.taskId()"))
    browser.execute_script("window.agentstateConsole.dropStream()")
    page.wait(lambda: "connection to the reply closed" in page.text("#notice"))
    page.screenshot("04-closed-stream")
    page.wait(lambda: "Declined by you" in page.text(".card .outcome"), timeout=20)
    page.wait(lambda: "3378.00" in page.text("#messages"))
    assert len(page.all(".card")) == 1


def test_stop_ends_the_turn(browser: WebDriver, console_url: str, screenshots: Path) -> None:
    page = Page(browser, console_url, new_user("dave"), screenshots)
    page.open()
    page.ask(QUESTION)
    page.wait(lambda: page.find("#stop").is_displayed() and page.text("#messages .msg.live"))
    page.find("#stop").click()
    page.wait(lambda: "Stopped before it finished" in page.text("#messages"), timeout=20)
    page.idle()
    assert not page.all(".card button.approve")


def test_delete_single_and_batch_with_a_confirmation_prompt(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    user = new_user("erin")
    ids = [chat(console_url, user, STATUS_QUESTION)[0]["conversation_id"] for _ in range(3)]
    page = Page(browser, console_url, user, screenshots)
    page.open(ids[0])
    page.wait(lambda: len(page.all("#conversations li")) == 3)
    # Rename, then delete one: dismissing the prompt changes nothing, accepting deletes.
    row = page.find(f"#conversations li[data-conversation-id='{ids[0]}']")
    row.find_element(By.CSS_SELECTOR, "button.rename").click()
    alert = browser.switch_to.alert
    alert.send_keys("订单状态")
    alert.accept()
    page.wait(lambda: "订单状态" in page.text("#conversations"))
    page.find(f"#conversations li[data-conversation-id='{ids[0]}'] button.delete").click()
    assert "订单状态" in browser.switch_to.alert.text
    browser.switch_to.alert.dismiss()
    assert len(page.all("#conversations li")) == 3
    page.find(f"#conversations li[data-conversation-id='{ids[0]}'] button.delete").click()
    browser.switch_to.alert.accept()
    page.wait(lambda: len(page.all("#conversations li")) == 2)
    assert page.text("#chat-title") == "New conversation"  # the open one was deleted
    for li in page.all("#conversations li"):
        li.find_element(By.CSS_SELECTOR, "input").click()
    page.find("#delete-selected").click()
    assert "Delete 2 conversations?" in browser.switch_to.alert.text
    browser.switch_to.alert.accept()
    page.wait(lambda: not page.all("#conversations li"))
    assert "Deleted 2 conversations" in page.text("#notice")
    for cid in ids:
        status, body = api(console_url, user, "GET", f"/api/conversations/{cid}/messages")
        assert status == 404 and "does not exist" in body["error"]


def test_the_inspector_after_a_compaction(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    user = new_user("frank")
    events = chat(console_url, user, QUESTION)
    conversation_id = events[0]["conversation_id"]
    card = next(e["card"] for e in events if e["type"] == "confirm")
    _, answered = api(
        console_url,
        user,
        "POST",
        "/api/confirm",
        {"conversation_id": conversation_id, "message_id": card["message_id"], "approved": False},
    )
    assert answered[-1]["type"] == "done"
    long_question = "我叫王小明，住在上海。" + "这是一段很长的补充说明，用来让上下文变大。" * 12
    chat(console_url, user, long_question, conversation_id)
    page = Page(browser, console_url, user, screenshots)
    page.open(conversation_id)
    page.wait(lambda: "早前对话摘要" in page.text("[data-field=summary]"))
    assert len(page.all("table.compactions tr")) == 2  # header + one compaction
    assert int(page.text("[data-field=context-count]")) < 8
    page.show_all_history()
    shown = page.text("#messages")
    # Every original message is still in the history: the question, the card, the reply.
    assert QUESTION in shown and "Declined by you" in shown and "3378.00" in shown
    assert "王小明" in shown
    page.no_internal_names()
    page.screenshot("06-compacted")


def test_users_are_isolated_and_bad_input_changes_nothing(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    alice, mallory = new_user("alice"), new_user("mallory")
    events = chat(console_url, alice, QUESTION)
    conversation_id = events[0]["conversation_id"]
    card = next(e["card"] for e in events if e["type"] == "confirm")
    _, before = api(console_url, alice, "GET", f"/api/conversations/{conversation_id}/messages")
    page = Page(browser, console_url, mallory, screenshots)
    page.open(conversation_id)  # a foreign conversation id
    page.wait(lambda: "does not exist" in page.text("#notice"))
    assert not page.all("#conversations li") and not page.all("#messages .msg")
    assert "Nothing to inspect" in page.text("#inspector-body")
    page.screenshot("07-foreign-conversation")
    page.open("999999")  # an unknown one
    page.wait(lambda: "does not exist" in page.text("#notice"))
    # Answering, renaming or deleting alice's conversation as mallory: refused.
    status, refused = api(
        console_url,
        mallory,
        "POST",
        "/api/confirm",
        {"conversation_id": conversation_id, "message_id": card["message_id"], "approved": True},
    )
    assert refused[-1]["type"] == "error" and "does not exist" in refused[-1]["message"]
    for method, path, body in [
        ("POST", f"/api/conversations/{conversation_id}/rename", {"title": "mine"}),
        ("DELETE", f"/api/conversations/{conversation_id}", None),
        ("GET", f"/api/conversations/{conversation_id}/inspector", None),
    ]:
        status, answer = api(console_url, mallory, method, path, body)
        assert status == 404 and "does not exist" in answer["error"], (path, answer)
    # Malformed input is refused with a sentence, before any call.
    assert api(console_url, mallory, "GET", "/api/conversations/abc/messages") == (
        400,
        {"error": "The conversation id must be a number, not 'abc'."},
    )
    assert api(console_url, mallory, "POST", "/api/chat", {"question": "  "})[1] == {
        "error": "Type a question first."
    }
    # No user from the proxy (and no development user): not signed in.
    request = urllib.request.Request(console_url + "/api/conversations")
    with pytest.raises(urllib.error.HTTPError) as refused_anonymous:
        urllib.request.urlopen(request, timeout=10)
    assert refused_anonymous.value.code == 401
    # Alice's conversation is exactly as it was, card still open.
    _, after = api(console_url, alice, "GET", f"/api/conversations/{conversation_id}/messages")
    assert after == before
    alice_page = Page(browser, console_url, alice, screenshots)
    alice_page.open(conversation_id)
    alice_page.open_card()
    assert [
        li.get_attribute("data-conversation-id") for li in alice_page.all("#conversations li")
    ] == [conversation_id]


# ----------------------------------------------------------------- what a user types


def test_a_question_sent_before_the_scripts_load_is_kept_and_then_sent(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    """A slow link: the page's script has not run when the user presses Send. The plain
    form posts to the console, which gives the page back with the question still in the
    box; once the script runs it sends it."""
    user = new_user("slow")
    page = Page(browser, console_url, user, screenshots)
    conversation_id = chat(console_url, user, STATUS_QUESTION)[0]["conversation_id"]
    later = "那88240呢？"
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/static/app.js"]})
    try:
        browser.get("about:blank")
        browser.get(f"{console_url}/#/c/{conversation_id}")
        page.wait(lambda: page.all("#question"))
        page.find("#question").send_keys(later)
        page.find("#send").click()  # no script: a plain form post
        page.wait(lambda: page.find("#composer").get_attribute("data-pending") == "1")
        assert page.find("#question").get_attribute("value") == later
        assert browser.current_url.endswith(f"#/c/{conversation_id}")  # still this one
        assert page.text("#user") == ""  # the script has still not run
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    # The script arrives late: it sends what was typed.
    browser.execute_script(
        "const s = document.createElement('script'); s.src = '/static/app.js';"
        " document.body.append(s);"
    )
    page.wait(lambda: page.user in page.text("#user"))
    page.wait(lambda: "88240" in page.text("#messages"), timeout=20)
    page.idle()
    assert page.find("#question").get_attribute("value") == ""
    assert page.conversation_id() == conversation_id
    _, newest = api(
        console_url, user, "GET", f"/api/conversations/{conversation_id}/messages?order=newest"
    )
    asked = [r["items"][0]["text"] for r in newest["records"] if r["role"] == "user"]
    assert asked == [later]  # sent once, into the open conversation
    _, listed = api(console_url, user, "GET", "/api/conversations")
    assert [c["conversation_id"] for c in listed["conversations"]] == [conversation_id]


def test_a_refused_question_stays_in_the_box_with_the_reason(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    user = new_user("kept")
    page = Page(browser, console_url, user, screenshots)
    page.open()
    page.ask(QUESTION)
    page.open_card()
    # A card is open: refused on the page, the question kept.
    page.ask(STATUS_QUESTION)
    page.wait(lambda: "answer the open confirmation card" in page.text("#composer-note"))
    assert page.find("#question").get_attribute("value") == STATUS_QUESTION
    # Another tab left a card open that this page, loaded before, does not know of: the
    # service refuses the question; it stays in the box, with the service's reason.
    conversation_id = chat(console_url, user, STATUS_QUESTION)[0]["conversation_id"]
    page.open(conversation_id)
    page.idle()
    # The page has loaded all it loads (its inspector saw no turn) before the other tab
    # asks: else it would see that turn running and follow it live, as it should.
    page.wait(lambda: "free" in page.text("[data-field=lease]"))
    other_tab = chat(console_url, user, QUESTION, conversation_id)
    assert any(e["type"] == "confirm" for e in other_tab)
    page.ask("还有别的订单吗？")
    page.wait(lambda: "Not sent" in page.text("#composer-note"), timeout=10)
    assert "confirmation card" in page.text("#composer-note")
    assert page.find("#question").get_attribute("value") == "还有别的订单吗？"
    page.screenshot("08-refused-question-kept")


def test_a_failed_first_load_says_why(
    browser: WebDriver, database_url: str, screenshots: Path
) -> None:
    """The agent is down: the page says so, never a blank list under 'signed in'."""
    console = ServiceProcess(
        "agentstate.console",
        {
            "CONSOLE_LISTEN_ADDRESS": "127.0.0.1:0",
            "CONSOLE_AGENT_ADDRESS": "127.0.0.1:1",  # nothing listens there
            "CONSOLE_STATE_ADDRESS": "127.0.0.1:1",
            "CONSOLE_USER_HEADER": USER_HEADER,
            "CONSOLE_DEV_USER": "",
            "CONSOLE_RPC_TIMEOUT_SECONDS": "2",
        },
    )
    try:
        base = console.wait_ready()
        page = Page(browser, base, new_user("down"), screenshots)
        browser.get("about:blank")
        browser.get(base)
        page.wait(lambda: page.find("#load-error").is_displayed(), timeout=20)
        shown = page.text("#load-error")
        assert "could not load your conversations" in shown and "unreachable" in shown
        assert "not connected" in page.text("#user")
        page.screenshot("09-first-load-failed")
    finally:
        browser.get("about:blank")
        assert console.terminate() == 0, console.output


# ----------------------------------------------------------------- polish


def test_markdown_is_rendered_and_hostile_input_stays_text(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    user = new_user("md")
    page = Page(browser, console_url, user, screenshots)
    page.open()
    hostile = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'
    page.ask(hostile + " [x](javascript:window.__pwned=1) **粗体**")
    page.idle()
    assert hostile in page.text("#messages .msg.user")
    shown = page.all("#messages img, #messages script, #conversations img")
    assert not shown and not browser.execute_script("return window.__pwned")
    # The renderer alone, with hostile markdown: tags stay text, only http(s) links.
    rendered = browser.execute_script(
        """const node = window.agentstateConsole.markdown(arguments[0]);
        return {html: node.innerHTML, text: node.textContent,
                tags: [...node.querySelectorAll('*')].map((n) => n.tagName.toLowerCase()),
                links: [...node.querySelectorAll('a')].map((a) => a.href)};""",
        "# 标题\n- **一** <b>二</b>\n- [ok](https://example.com) [bad](javascript:alert(1))\n"
        "```\n<script>alert(1)</script>\n```\n<iframe src=x></iframe>",
    )
    assert set(rendered["tags"]) <= {"div", "h3", "ul", "li", "strong", "a", "pre", "code", "p"}
    assert rendered["links"] == ["https://example.com/"]
    assert "<b>二</b>" in rendered["text"] and "<iframe src=x></iframe>" in rendered["text"]
    assert "<script>" not in rendered["html"] and "<iframe" not in rendered["html"]


def test_the_list_has_timestamps_and_search_and_plurals_are_right(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    user = new_user("list")
    ids = [chat(console_url, user, STATUS_QUESTION)[0]["conversation_id"] for _ in range(3)]
    # Two renamed (the rename a person makes): the search has titles to tell apart.
    for cid, title in ((ids[1], "Watch order 手表"), (ids[2], "Watch strap")):
        status, _ = api(
            console_url, user, "POST", f"/api/conversations/{cid}/rename", {"title": title}
        )
        assert status == 200
    page = Page(browser, console_url, user, screenshots)
    page.open()
    page.wait(lambda: len(page.all("#conversations li")) == 3)
    # Identical titles stay apart: each row says when and which.
    stamps = browser.execute_script(
        "return [...document.querySelectorAll('#conversations li [data-field=updated]')]"
        ".map((e) => e.textContent)"
    )
    assert len(set(stamps)) == 3 and all(":" in s for s in stamps), stamps
    # The search (a title prefix) runs on the state service, as the user types.
    page.find("#search-title").send_keys("Watch")
    page.wait(lambda: sorted(page.listed()) == sorted(ids[1:]))
    page.find("#search-title").send_keys(" order")
    page.wait(lambda: page.listed() == [ids[1]])
    status, found = api(console_url, user, "GET", "/api/conversations?q=Watch%20s")
    assert status == 200 and [c["conversation_id"] for c in found["conversations"]] == [ids[2]]
    page.find("#search-title").clear()
    page.find("#search-title").send_keys("没有这个标题")
    page.wait(lambda: page.find("#no-match").is_displayed())
    page.find("#search-title").clear()
    page.find("#search-title").send_keys(" ")  # an input event; every row back
    page.wait(lambda: len(page.all("#conversations li")) == 3)
    assert not page.find("#no-match").is_displayed()
    # One, then two: the count in words.
    page.find(f"#conversations li[data-conversation-id='{ids[0]}'] input").click()
    page.find("#delete-selected").click()
    browser.switch_to.alert.accept()
    page.wait(lambda: "Deleted 1 conversation." in page.text("#notice"))
    page.wait(lambda: len(page.all("#conversations li")) == 2)
    for li in page.all("#conversations li"):
        li.find_element(By.CSS_SELECTOR, "input").click()
    page.find("#delete-selected").click()
    assert "Delete 2 conversations?" in browser.switch_to.alert.text
    browser.switch_to.alert.accept()
    page.wait(lambda: "Deleted 2 conversations." in page.text("#notice"))


def test_the_list_shows_status_badges_and_filters_by_status_on_the_server(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    """Issue 23 in the rebuilt list: a conversation waiting on a card says so, an idle one
    carries no badge, and the status filter is the state service's."""
    from selenium.webdriver.support.ui import Select

    user = new_user("status")
    waiting = chat(console_url, user, QUESTION)[0]["conversation_id"]  # a card left open
    idle = chat(console_url, user, STATUS_QUESTION)[0]["conversation_id"]
    page = Page(browser, console_url, user, screenshots)
    page.open()
    page.wait(lambda: sorted(page.listed()) == sorted([waiting, idle]))
    row = f"#conversations li[data-conversation-id='{waiting}']"
    page.wait(lambda: page.text(f"{row} .status.AWAITING_CONFIRMATION") == "card")
    assert not page.all(f"#conversations li[data-conversation-id='{idle}'] .status")
    status = Select(page.find("#search-status"))
    status.select_by_value("AWAITING_CONFIRMATION")
    page.wait(lambda: page.listed() == [waiting])
    status.select_by_value("IDLE")
    page.wait(lambda: page.listed() == [idle])
    status.select_by_value("FAILED")
    page.wait(lambda: page.find("#no-match").is_displayed() and not page.listed())
    status.select_by_value("")
    page.wait(lambda: sorted(page.listed()) == sorted([waiting, idle]))
    assert not page.find("#no-match").is_displayed()


def test_a_narrow_screen_shows_every_panel(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    user = new_user("narrow")
    conversation_id = chat(console_url, user, STATUS_QUESTION)[0]["conversation_id"]
    page = Page(browser, console_url, user, screenshots)
    browser.set_window_size(600, 900)
    try:
        page.open(conversation_id)
        page.wait(lambda: "88235" in page.text("#messages"))
        width = browser.execute_script("return document.documentElement.clientWidth")
        for css in ("#sidebar", "#chat", "#inspector", "#question", "#send"):
            box = browser.execute_script(
                "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
                " return [r.left, r.right, r.width];",
                css,
            )
            assert box[0] >= 0 and box[1] <= width + 1 and box[2] > 0, (css, box, width)
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        )
        page.screenshot("10-narrow")
    finally:
        browser.set_window_size(1400, 900)


# ----------------------------------------------------------------- live turns, any replica

STEP_SECONDS = 4.0  # the scripted model's wait before each step: room to act between two


@pytest.fixture(scope="module")
def two_replicas(database_url: str) -> Iterator[tuple[str, str]]:
    """Two agent replicas, each behind its own console, on one state service: a page
    moving from one console to the other is a reload that lands on another replica."""
    services: list[ServiceProcess] = []
    with StateServices() as states:
        try:
            state_address = states.serve(on_postgres(database_url))
            urls = []
            for _ in range(2):
                agent = ServiceProcess(
                    "agentstate.agent_service",
                    {
                        "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
                        "AGENT_AUTH_MODE": "dev-header",
                        "AGENT_STATE_ADDRESS": state_address,
                        "AGENT_PROFILE": "order_demo",
                        "ORDERS_DATABASE_URL": "",
                        "AGENT_SCRIPTED_STEP_DELAY_SECONDS": str(STEP_SECONDS),
                        "AGENT_LEASE_RENEW_SECONDS": "0.2",
                    },
                )
                services.append(agent)
                console = ServiceProcess(
                    "agentstate.console",
                    {
                        "CONSOLE_LISTEN_ADDRESS": "127.0.0.1:0",
                        "CONSOLE_AGENT_ADDRESS": agent.wait_ready(),
                        "CONSOLE_STATE_ADDRESS": state_address,
                        "CONSOLE_USER_HEADER": USER_HEADER,
                        "CONSOLE_DEV_USER": "",
                    },
                )
                services.append(console)
                urls.append(console.wait_ready())
            yield urls[0], urls[1]
        finally:
            codes = [s.terminate() for s in reversed(services)]
            assert codes == [0] * len(codes), "\n".join(s.output for s in services)


def test_stop_from_a_reloaded_page(
    browser: WebDriver, two_replicas: tuple[str, str], screenshots: Path
) -> None:
    """A turn started through replica A; the page reloads onto replica B in the middle.
    B's page shows what was streamed so far, the steps that follow as they happen, and
    Stop, which stops the turn running on A. Deterministic: every step of the scripted
    model waits STEP_SECONDS first, and each check waits for the state it needs (the
    first step shown, the second step shown) before acting, well inside the next wait."""
    first, second = two_replicas
    user = new_user("reload")
    page = Page(browser, first, user, screenshots)
    page.open()
    page.ask(QUESTION)
    conversation_id = page.conversation_id()
    page.wait(lambda: "load_skill" in page.text("#messages .msg.live"), timeout=STEP_SECONDS * 3)
    # The reload lands on the other console and replica; the turn runs on in replica A.
    other = Page(browser, second, user, screenshots)
    other.open(conversation_id)
    other.wait(lambda: "following it live" in other.text("#notice"), timeout=5)
    other.wait(lambda: "load_skill" in other.text("#messages .msg.live"), timeout=5)
    assert "我先看一下订单变更的处理规范" in other.text("#messages .msg.live")
    other.wait(lambda: other.find("#stop").is_displayed(), timeout=5)
    # The next step appears as it happens (within a second of the agent writing it).
    other.wait(lambda: "query_order" in other.text("#messages .msg.live"), timeout=STEP_SECONDS * 2)
    other.screenshot("11-attached-on-another-replica")
    assert not other.all(".card")
    other.find("#stop").click()
    other.wait(lambda: "Stopped before it finished" in other.text("#messages"), timeout=10)
    other.idle()
    assert not other.all(".card button.approve") and not other.all("#messages .msg.live")
    _, history = api(second, user, "GET", f"/api/conversations/{conversation_id}/messages")
    assert not [r for r in history["records"] if r["streaming"]]
    assert history["records"][-1]["status_words"] == "Stopped before it finished"
    # The live stream resumes after an offset: asked after the end, it says the turn ended.
    status, events = api(
        second,
        user,
        "GET",
        f"/api/conversations/{conversation_id}/live?after=0",
    )
    assert status == 200 and events == [{"type": "ended"}]


def test_the_timeline_of_a_turn_comes_from_its_stored_record(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    """Model calls with tokens, tool calls with inputs and outputs, durations, the turn's
    start (lease, state load), the save and the trace link: read from the records (a
    fresh page load, nothing kept in the browser)."""
    user = new_user("timeline")
    conversation_id = chat(console_url, user, STATUS_QUESTION)[0]["conversation_id"]
    _, history = api(console_url, user, "GET", f"/api/conversations/{conversation_id}/messages")
    saved = history["records"][-1]["timeline"]
    kinds = [e["kind"] for e in saved["events"]]
    assert kinds[0] == "begin" and kinds[-1] == "save" and "model" in kinds and "tool" in kinds
    (tool,) = [e for e in saved["events"] if e["kind"] == "tool"]
    assert (tool["name"], tool["input"], tool["outcome"]) == (
        "query_order",
        {"limit": 5},
        "succeeded",
    )
    assert "88240" in tool["output"] and tool["ms"] >= 0
    models = [e for e in saved["events"] if e["kind"] == "model"]
    assert all(m["ms"] >= 400 and m["tokens"]["output_tokens"] > 0 for m in models)  # 0.4 s steps
    assert len(saved["trace_id"]) == 32 or saved["trace_id"] == ""
    page = Page(browser, console_url, user, screenshots)
    page.open(conversation_id)
    page.wait(lambda: "tool query_order" in page.text("#timeline-body"))
    shown = page.text("#timeline-body")
    assert "BeginTurn" in shown and "EndTurn" in shown and "tokens in" in shown
    assert '{"limit":5}' in shown.replace(" ", "")
    trace = page.find("[data-field=trace]")
    if saved["trace_id"]:
        link = trace.find_element(By.CSS_SELECTOR, "a").get_attribute("href")
        assert link == f"http://traces.example/trace/{saved['trace_id']}"
    else:
        assert "tracing off" in trace.text
    page.screenshot("12-timeline")


# ----------------------------------------------------------------- every framework's sessions


def _framework_sessions(address: str, user: str) -> dict[str, str]:
    """A LangGraph thread stopped at its approval interrupt, an OpenAI Agents session and
    an ADK session, each written by its adapter; their conversation ids by kind."""
    import asyncio

    pytest.importorskip("langgraph")
    pytest.importorskip("agents")
    pytest.importorskip("google.adk")
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types
    from langchain_core.messages import HumanMessage

    from agentstate.client import AsyncStateClient, StateClient
    from agentstate.examples.langgraph_approval.graph import QUESTION as GRAPH_QUESTION
    from agentstate.examples.langgraph_approval.graph import build
    from agentstate.integrations.adk import AgentStateSessionService
    from agentstate.integrations.langgraph import AgentStateSaver
    from agentstate.integrations.openai_agents import AgentStateSession

    thread, session_id = f"thread-{uuid.uuid4().hex[:6]}", f"s-{uuid.uuid4().hex[:6]}"
    saver = AgentStateSaver(address, user_id=user)
    try:
        config: Any = {"configurable": {"thread_id": thread}}
        result = build(saver).invoke(
            {"messages": [HumanMessage(GRAPH_QUESTION)], "executed": []}, config
        )
        assert result["__interrupt__"]
    finally:
        saver.close()

    async def sessions() -> None:
        async with AsyncStateClient.connect(address) as state:
            openai_session = AgentStateSession(session_id, client=state, user_id=user)
            await openai_session.add_items(
                [
                    {"role": "user", "content": "Where is order 88235?"},
                    {"role": "assistant", "content": "Order 88235 is paid, awaiting shipment."},
                ]
            )
            service = AgentStateSessionService(state)
            adk = await service.create_session(
                app_name="console-app",
                user_id=user,
                session_id=session_id,
                state={"topic": "orders", "user:language": "zh", "app:region": "cn"},
            )
            await service.append_event(
                adk,
                Event(
                    author="user",
                    content=types.Content(role="user", parts=[types.Part(text="取消88235")]),
                    actions=EventActions(state_delta={"asked": 1}),
                ),
            )

    asyncio.run(sessions())
    with StateClient.connect(address) as state:
        return {
            kind: state.resolve_conversation(user, key, create=False).conversation.conversation_id
            for kind, key in (
                ("langgraph", thread),
                ("openai-agents", f"openai:{session_id}"),
                ("adk", f"adk:console-app:{session_id}"),
            )
        }


def test_every_frameworks_sessions_are_shown_read_only(
    browser: WebDriver, console_url: str, screenshots: Path
) -> None:
    user = new_user("frameworks")
    ids = _framework_sessions(STATE_ADDRESS[0], user)
    page = Page(browser, console_url, user, screenshots)
    # LangGraph: the checkpoint history, channel values, pending writes, and the
    # interrupt as a waiting card.
    page.open(ids["langgraph"])
    page.wait(lambda: page.all(".framework[data-kind=langgraph]"))
    shown = page.text(".framework")
    assert "LangGraph thread" in shown and "checkpoints" in shown
    assert "waiting for a human" in page.text("[data-field=interrupt]")
    assert "cancel_order" in page.text("[data-field=interrupt]")
    assert len(page.all(".framework .checkpoint")) >= 2
    newest = page.all(".framework .checkpoint")[0].text
    assert "channel values" in newest and "pending writes" in newest
    assert "88235" in newest  # the messages channel, decoded
    assert page.find("#send").get_attribute("disabled") and "read-only" in page.text(
        "#composer-note"
    )
    page.screenshot("13-langgraph-thread")
    # OpenAI Agents: the session's items.
    page.open(ids["openai-agents"])
    page.wait(lambda: page.all(".framework[data-kind=openai-agents]"))
    assert len(page.all(".framework .item")) == 2
    assert "Order 88235 is paid" in page.text(".framework")
    # ADK: the events, and the state by scope.
    page.open(ids["adk"])
    page.wait(lambda: page.all(".framework[data-kind=adk]"))
    assert "取消88235" in page.text(".framework .item")
    assert '"topic": "orders"' in page.text(".scope[data-scope=session]")
    assert '"asked": 1' in page.text(".scope[data-scope=session]")
    assert "zh" in page.text(".scope[data-scope=user]")
    assert "cn" in page.text(".scope[data-scope=app]")
    page.screenshot("14-adk-session")
    # The agent's own conversations are untouched by this: still the usual view.
    own = chat(console_url, user, STATUS_QUESTION)[0]["conversation_id"]
    page.open(own)
    page.wait(lambda: "88235" in page.text("#messages .msg.assistant"))
    assert not page.all(".framework")


def test_a_long_model_wait_shows_progress_with_retry(
    browser: WebDriver, two_replicas: tuple[str, str], screenshots: Path
) -> None:
    """The model is silent (each scripted step waits STEP_SECONDS): the page shows the
    time elapsed with Retry; Retry stops the turn and asks the same question again.
    (The agent's own progress events, attempt k of n, are tested in
    tests/agent_service/test_model_failures.py.)"""
    first, _ = two_replicas
    page = Page(browser, first, new_user("wait"), screenshots)
    page.open()
    page.ask(STATUS_QUESTION)
    page.wait(lambda: "Waiting for the model" in page.text("[data-field=wait]"), timeout=10)
    page.wait(
        lambda: " 3 s" in page.text("[data-field=wait]") or " 4 s" in page.text("[data-field=wait]")
    )
    page.screenshot("15-model-wait")
    conversation_id = page.conversation_id()
    page.find("[data-field=wait] button.retry").click()
    page.wait(lambda: "实付3378.00" in page.text("#messages"), timeout=STEP_SECONDS * 5)
    page.idle()
    _, history = api(first, page.user, "GET", f"/api/conversations/{conversation_id}/messages")
    words = [r["status_words"] for r in history["records"] if r["role"] == "assistant"]
    assert words[0] == "Stopped before it finished" and words[-1] == ""
    assert [r for r in history["records"] if r["role"] == "user"][-1]["items"][0]["text"] == (
        STATUS_QUESTION
    )


def test_a_model_failure_and_a_missing_user_each_have_their_own_words(
    browser: WebDriver, database_url: str, screenshots: Path
) -> None:
    """The model endpoint refuses connections: the page says the model failed, not that
    the service is unreachable. A request without a user: 'not signed in'."""
    services: list[ServiceProcess] = []
    with StateServices() as states:
        try:
            state_address = states.serve(on_postgres(database_url))
            agent = ServiceProcess(
                "agentstate.agent_service",
                {
                    "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
                    "AGENT_AUTH_MODE": "dev-header",
                    "AGENT_STATE_ADDRESS": state_address,
                    "AGENT_PROFILE": "order_demo",
                    "ORDERS_DATABASE_URL": "",
                    "AGENT_MODEL": "openai",
                    "OPENAI_API_KEY": "placeholder",
                    "OPENAI_BASE_URL": "http://127.0.0.1:1/v1",  # nothing listens there
                    "OPENAI_MAX_RETRIES": "0",
                },
            )
            services.append(agent)
            console = ServiceProcess(
                "agentstate.console",
                {
                    "CONSOLE_LISTEN_ADDRESS": "127.0.0.1:0",
                    "CONSOLE_AGENT_ADDRESS": agent.wait_ready(),
                    "CONSOLE_STATE_ADDRESS": state_address,
                    "CONSOLE_USER_HEADER": USER_HEADER,
                    "CONSOLE_DEV_USER": "",
                },
            )
            services.append(console)
            base = console.wait_ready()
            page = Page(browser, base, new_user("modelfail"), screenshots)
            page.open()
            page.ask(STATUS_QUESTION)
            page.wait(lambda: "The model did not answer" in page.text("#notice"), timeout=20)
            assert "unreachable" not in page.text("#notice")
            page.idle()
            assert "暂时连不上模型服务" in page.text("#messages")  # the agent's own sentence
            page.screenshot("16-model-failed")
            # No user from the proxy: the page says so, in its own words.
            browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
            browser.get("about:blank")
            browser.get(base)
            page.wait(lambda: page.find("#load-error").is_displayed(), timeout=10)
            assert "not signed in" in page.text("#load-error")
            assert page.text("#user") == "not signed in"
        finally:
            browser.get("about:blank")
            codes = [s.terminate() for s in reversed(services)]
            assert codes == [0] * len(codes), "\n".join(s.output for s in services)


def test_a_conversation_longer_than_5000_records_opens_at_its_newest_page(
    console_url: str,
) -> None:
    """The newest page is read newest first (one page, not the whole conversation, which
    the console once capped at 5000 records); "Show earlier messages" pages back to the
    first record, and a call answered in a newer record shows its output on the page
    before it. Records are written with the state client directly (in batches)."""
    from agentstate.client import MessageRole, NewMessage, StateClient

    user, count = new_user("long"), 5003
    texts = [
        NewMessage(MessageRole.USER, [{"type": "text", "text": f"m{i}"}]) for i in range(count)
    ]
    # The last three: a call, its answer in the next record, a reply (2 records a page).
    use = {"type": "tool_use", "id": "c9", "name": "query_order", "input": {"orderNo": "1"}}
    answer = {"type": "tool_result", "id": "c9", "state": "success", "output": "paid"}
    texts[-3] = NewMessage(MessageRole.ASSISTANT, [use])
    texts[-2] = NewMessage(MessageRole.USER, [answer])
    with StateClient.connect(STATE_ADDRESS[0]) as state:
        cid = state.create_conversation(user, "long").conversation_id
        for start in range(0, count, 1000):
            state.upsert_state(user, cid, {"n": start}, writes=texts[start : start + 1000])
        ids = [m.message_id for m in state.list_messages(user, cid, page_size=3).items]
    path = f"/api/conversations/{cid}/messages?order=newest"
    status, newest = api(console_url, user, "GET", path)
    assert status == 200, newest
    # The answer's record draws no item of its own (its result shows under the call).
    assert [[i.get("text") for i in r["items"]] for r in newest["records"]] == [
        [],
        [f"m{count - 1}"],
    ]
    assert newest["earlier"] == newest["records"][0]["message_id"]
    status, before = api(console_url, user, "GET", f"{path}&before={newest['earlier']}")
    assert status == 200, before
    (call,) = before["records"][1]["items"]
    assert call["tool_name"] == "query_order" and call["output"] == "paid"  # from a newer record
    seen: list[str] = []
    earlier = before["earlier"]
    for _ in range(3):  # back, two at a time, as the page's button does
        status, older = api(console_url, user, "GET", f"{path}&before={earlier}")
        assert status == 200, older
        seen[:0] = [r["items"][0]["text"] for r in older["records"]]
        earlier = older["earlier"]
    assert seen == [f"m{i}" for i in range(count - 10, count - 4)]
    # ...and at the start: the page before the third record is the first two, no earlier.
    third = ids[2]
    status, first = api(console_url, user, "GET", f"{path}&before={third}")
    assert [r["items"][0]["text"] for r in first["records"]] == ["m0", "m1"]
    assert first["earlier"] == ""
    status, bad = api(console_url, user, "GET", f"{path}&before=nope")
    assert status == 400, bad
