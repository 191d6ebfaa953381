"""The Gradio app: rendering, cache reuse, its API and a real headless browser.

The app runs in this process on a free loopback port with the tiny test
checkpoints. The browser test drives Debian's chromium through Selenium; its
set-up installs ``chromium chromium-driver`` with apt-get when they are
missing and skips with the reason only if that fails.
"""

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # ``ui`` is not an installed package
    sys.path.insert(0, str(REPO_ROOT))

import mlx_spec  # noqa: F401  (OpenBLAS before mlx.core)

# isort: split

gr = pytest.importorskip("gradio")

from mlx_spec.config import METHODS  # noqa: E402
from ui import render  # noqa: E402
from ui.app import (  # noqa: E402
    create_app,
    is_loopback,
    launch_kwargs,
    main,
    parse_auth,
)
from ui.session import Options, Session, encode_prompt, run_turn  # noqa: E402

ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
CODE_PROMPT = "def fibonacci(n):\n"
# The random test target continues this one for over 1500 greedy tokens.
LONG_PROMPT = "class Stack:\n    def __init__(self):\n"


# --- pure pieces ---------------------------------------------------------------------


def test_token_spans_escape_text_and_carry_the_rejected_draft():
    pieces = [
        render.Piece("<b>", "accepted", 0),
        render.Piece("x", "recovered", 0, rejected='a"\nb'),
        render.Piece("", "bonus", 1),
        render.Piece("y", "bonus", 1),
    ]
    out = render.token_spans(pieces)
    assert "&lt;b&gt;" in out and "<b>" not in out
    assert 'class="tok tok-recovered"' in out
    assert 'data-rejected="draft proposed: a&quot;\u21b5b"' in out
    assert out.count("<span") == 3  # the empty piece is skipped
    assert 'class="tok tok-bonus odd"' in out


def test_chart_has_one_filled_bar_per_round_with_accepted_tokens():
    assert "fills in" in render.chart_svg([])
    svg = render.chart_svg([0, 2, 4], [4, 4, 4])
    assert svg.count("<title>round") == 2
    assert "mean 2.00" in svg


def test_race_verdict_reports_speedup_and_identical_or_different_texts():
    plain = render.Lane("draft", "abc", 50.0, 2.0, 100)
    spec = render.Lane("draft", "abc", 100.0, 1.0, 100)
    same = render.race_verdict(plain, spec, greedy=True)
    assert "2.00&times;</b> faster" in same and "identical" in same
    spec.text = "axc"
    assert "differ from character 1" in render.race_verdict(plain, spec, greedy=True)
    short = render.race_verdict(
        render.Lane("draft", "a", 5.0, 1.0, 3), spec, greedy=True
    )
    assert "too few" in short


def test_access_flags():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0")
    assert parse_auth(["ann:secret"]) == [("ann", "secret")]
    with pytest.raises(ValueError, match="user:password"):
        parse_auth(["ann"])
    with pytest.raises(SystemExit) as e:
        main(["--host", "0.0.0.0", "--no-preload"])
    assert e.value.code == 2


# --- the app in this process ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app(checkpoints):
    return create_app(str(checkpoints["llama"]), str(checkpoints["llama-near"]))


@pytest.fixture(scope="module")
def server(app):
    demo = app.build()
    demo.queue()
    port = _free_port()
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        prevent_thread_lock=True,
        quiet=True,
        **launch_kwargs(),
    )
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def _reply(app, session, pair, tokens, options, use_cache=True, stop_after=None):
    text, n = "", 0
    for batch in app.worker.stream(
        lambda: run_turn(session, pair, tokens, options, use_cache), session.stop
    ):
        for piece, _ in batch:
            text, n = text + piece.text, n + 1
            if stop_after is not None and n >= stop_after:
                session.stop.set()
    session.stop.clear()
    return text


def test_multi_turn_reuses_the_cache_and_matches_a_fresh_run(app, checkpoints):
    pair = app.load_pair(str(checkpoints["llama"]), str(checkpoints["llama-near"]))
    options = Options(method="draft", max_tokens=24)
    session = Session()
    first = encode_prompt(pair.tokenizer, CODE_PROMPT, [], chat=False)
    # Stopped early: the cache must hold exactly the prompt and the yielded tokens.
    partial = _reply(
        app, session, pair, first, Options(method="draft", max_tokens=200), stop_after=5
    )
    assert len(session.cache_tokens) >= len(first) + 5
    follow = encode_prompt(
        pair.tokenizer, CODE_PROMPT + partial + "\n    return", [], False
    )
    cached = _reply(app, session, pair, follow, options)
    assert session.last_reused > len(first)
    assert cached == _reply(app, Session(), pair, follow, options, use_cache=False)
    # A chat turn on top, then back to plain decoding (a different cache layout).
    history = [render.Turn("hi", [render.Piece(cached)])]
    chat = encode_prompt(pair.tokenizer, "and again", history, chat=True)
    plain = Options(method="none", max_tokens=24)
    assert _reply(app, session, pair, chat, plain) == _reply(
        app, Session(), pair, chat, plain, use_cache=False
    )


@pytest.mark.parametrize("method", [m for m in METHODS if m != "none"])
def test_every_method_gives_the_plain_greedy_text(app, checkpoints, method):
    plain = app.api_generate(LONG_PROMPT, method="none", max_tokens=32, raw=True)
    out = app.api_generate(
        LONG_PROMPT, method=method, max_tokens=32, raw=True, adaptive=True
    )
    assert out["text"] == plain["text"] and out["stats"]["method"] == method


def test_api_generate_matches_plain_greedy_decoding(server, load_model):
    from gradio_client import Client
    from mlx_lm import generate as mlx_lm_generate

    model, tokenizer = load_model("llama")
    client = Client(server, verbose=False)
    for raw in (True, False):
        out = client.predict(CODE_PROMPT, api_name="/generate", raw=raw, max_tokens=40)
        prompt = CODE_PROMPT
        if not raw:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": CODE_PROMPT}],
                tokenize=False,
                add_generation_prompt=True,
            )
            prompt = tokenizer.encode(text, add_special_tokens=False)
        expected = mlx_lm_generate(model, tokenizer, prompt, max_tokens=40)
        assert out["text"] == expected
        assert out["stats"]["method"] == "draft" and out["stats"]["rounds"] >= 1


def test_race_endpoint_shows_identical_greedy_texts(server, checkpoints):
    from gradio_client import Client

    client = Client(server, verbose=False)
    target, draft = str(checkpoints["llama"]), str(checkpoints["llama-near"])
    settings = [target, draft, "draft", 4, 16, False, 0.0, 1.0, 40, "", True]
    plain, _, spec, _, verdict, chart = client.predict(
        CODE_PROMPT, *settings, api_name="/race"
    )
    assert "identical" in verdict and "&times;" in verdict
    assert "tok-accepted" in spec and "tok-accepted" not in plain
    assert "<svg" in chart
    _, _, _, _, refused, _ = client.predict(
        CODE_PROMPT, *settings[:2], "none", *settings[3:], api_name="/race"
    )
    assert "choose a speculative method" in refused


def test_chat_endpoint_reuses_the_prompt_cache_on_the_next_turn(server, checkpoints):
    from gradio_client import Client

    client = Client(server, verbose=False)
    target, draft = str(checkpoints["llama"]), str(checkpoints["llama-near"])
    settings = [target, draft, "draft", 4, 16, False, 0.0, 1.0, 24, "", False]
    first = client.predict("hello", *settings, api_name="/chat")
    second = client.predict("and again", *settings, api_name="/chat")
    transcript, stats, _, status, _ = second
    assert "Done:" in first[3] and "Done:" in status
    assert transcript.count('class="spec-role">you<') == 2
    assert "reused from the cache" in stats


def test_api_bad_inputs_give_readable_errors_and_the_app_keeps_running(
    server, checkpoints
):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(server, verbose=False)
    with pytest.raises(AppError, match="max_tokens=0 is out of range"):
        client.predict(CODE_PROMPT, api_name="/generate", max_tokens=0)
    with pytest.raises(AppError, match="does not exist"):
        client.predict(CODE_PROMPT, api_name="/generate", model="/no/such/model")
    with pytest.raises(AppError, match="tokenizer differs"):
        client.predict(
            CODE_PROMPT,
            api_name="/generate",
            model=str(checkpoints["llama"]),
            draft_model=str(checkpoints["llama-othertok"]),
        )
    with pytest.raises(AppError, match="needs a draft model"):
        client.predict(CODE_PROMPT, api_name="/generate", draft_model="(none)")
    with pytest.raises(AppError, match="method 'bogus' is unknown"):
        client.predict(CODE_PROMPT, api_name="/generate", method="bogus")
    out = client.predict(CODE_PROMPT, api_name="/generate", raw=True, max_tokens=8)
    assert out["finish_reason"] in ("length", "stop")


# --- a real browser -------------------------------------------------------------------------


def _ensure_chromium():
    def present():
        return shutil.which("chromium") and shutil.which("chromedriver")

    if present():
        return
    log = ""
    for cmd in (
        ["apt-get", "install", "-y", "chromium", "chromium-driver"],
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "chromium", "chromium-driver"],
    ):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            log = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            log = log[0]
        except (OSError, subprocess.TimeoutExpired) as e:
            log = str(e)
        if present():
            return
    pytest.skip(
        f"browser test skipped: chromium and chromium-driver could not be installed "
        f"with apt-get ({log})"
    )


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    _ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    profile = tempfile.mkdtemp(prefix="mlx-spec-chromium-")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1050",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(
        service=Service(shutil.which("chromedriver")), options=options
    )
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _wait(what, check, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = check()
        except Exception:  # elements appear and re-render while Gradio updates
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _set(driver, selector, text):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.CSS_SELECTOR, selector)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(text)


@pytest.mark.browser
def test_browser_streams_colours_stops_and_recovers(server, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    def text_of(selector):
        return browser.find_element(By.CSS_SELECTOR, selector).text

    def token_classes():  # one script call: the page re-renders while streaming
        return browser.execute_script(
            "return Array.from(document.querySelectorAll('#transcript span.tok'))"
            ".map(e => e.className)"
        )

    browser.get(server)
    _wait("the mode note", lambda: "mode" in text_of("#mode-note"))
    assert browser.title == "mlx-spec"
    # Completion mode keeps the random test model away from an early end of text.
    browser.find_element(
        By.XPATH, "//label[contains(., 'Ignore the chat template')]"
    ).click()
    _wait("completion mode", lambda: "Completion mode" in text_of("#mode-note"))
    _set(browser, "#max-tokens input", "4000")
    _set(browser, "#prompt textarea", LONG_PROMPT)
    browser.find_element(By.CSS_SELECTOR, "#send").click()

    _wait("streamed tokens", lambda: len(token_classes()) >= 8)
    _wait(
        "live stats",
        lambda: "tokens/s" in text_of("#stats") and "rounds" in text_of("#stats"),
    )
    kinds = {k for c in token_classes() for k in c.split()}
    assert "tok-accepted" in kinds and ({"tok-recovered", "tok-bonus"} & kinds)
    assert browser.find_elements(By.CSS_SELECTOR, "#chart svg rect")

    browser.find_element(By.CSS_SELECTOR, "#stop").click()
    try:
        _wait("the stop", lambda: "Stopped after" in text_of("#status"))
    except AssertionError:
        browser.save_screenshot("/tmp/ui_fail.png")
        raise AssertionError(text_of("#status") + " | " + text_of("#stats"))
    assert "[stopped]" in text_of("#transcript")
    assert len(token_classes()) < 4000

    _set(browser, "#max-tokens input", "60")
    _set(browser, "#prompt textarea", CODE_PROMPT)
    browser.find_element(By.CSS_SELECTOR, "#send").click()
    _wait("the next request", lambda: "Done:" in text_of("#status"))
    assert "[max tokens reached]" in text_of(
        "#transcript"
    ) or "[end of text]" in text_of("#transcript")
    tip = browser.execute_script(
        "const t = document.querySelector('#transcript .tok-recovered');"
        "return t && t.dataset.rejected;"
    )
    assert tip and tip.startswith("draft proposed")
    ARTIFACTS.mkdir(exist_ok=True)
    browser.set_window_size(1400, 1500)
    browser.execute_script("window.scrollTo(0, 0)")
    recovered = browser.find_elements(By.CSS_SELECTOR, "#transcript .tok-recovered")
    ActionChains(browser).move_to_element(recovered[len(recovered) // 2]).perform()
    time.sleep(0.3)
    browser.save_screenshot(str(ARTIFACTS / "ui.png"))
