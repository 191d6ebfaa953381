"""mlx_spec.server end to end: a real server on a free 127.0.0.1 port.

The server runs in background threads of the test process (mlx_lm's HTTP
thread pool plus its generation thread). Greedy answers must equal plain
mlx_lm decoding, computed before the server starts.
"""

import http.client
import json
import socket
import threading
import urllib.error
import urllib.request

import httpx
import mlx_lm
import pytest
from openai import OpenAI

from mlx_spec.config import METHODS
from mlx_spec.integration import plan_method
from mlx_spec.server import STATS_FIELD, SpecServer, setup_arg_parser

MAX_TOKENS = 16
PROMPTS = (
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "The quick brown fox",
    "class Parser:\n    def __init__(self",
)
CHAT = [{"role": "user", "content": "Write a parser."}]
# What a request runs when it names no method (the server has a draft).
DEFAULT_METHOD = plan_method(None, draft_model=object())[0]


def _greedy(model, tokenizer, tokens, max_tokens=MAX_TOKENS) -> str:
    return mlx_lm.generate(model, tokenizer, tokens, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def references(load_model):
    model, tokenizer = load_model("llama")
    texts = {p: _greedy(model, tokenizer, tokenizer.encode(p)) for p in PROMPTS}
    chat_tokens = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    texts["chat"] = _greedy(model, tokenizer, chat_tokens)
    return texts


@pytest.fixture(scope="module")
def server(checkpoints, references):
    args = setup_arg_parser().parse_args(
        [
            "--model",
            str(checkpoints["llama"]),
            "--draft-model",
            str(checkpoints["llama-near"]),
            "--port",
            "0",
            "--max-tokens",
            str(MAX_TOKENS),
            "--log-level",
            "CRITICAL",
        ]
    )
    server = SpecServer(args).start()
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    http_client = httpx.Client(trust_env=False, timeout=60)
    yield OpenAI(base_url=server.url + "/v1", api_key="unused", http_client=http_client)
    http_client.close()


def _post(server, path, body, timeout=60):
    request = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_server_listens_on_localhost_by_default():
    args = setup_arg_parser().parse_args([])
    assert args.host == "127.0.0.1"
    assert args.speculative is None and args.num_draft_tokens == 4


def test_completion_with_openai_client_equals_plain_greedy(client, references):
    response = client.completions.create(
        model="default_model", prompt=PROMPTS[0], max_tokens=MAX_TOKENS
    )
    assert response.choices[0].text == references[PROMPTS[0]]
    assert response.usage.completion_tokens == MAX_TOKENS
    assert response.usage.total_tokens == (
        response.usage.prompt_tokens + response.usage.completion_tokens
    )
    stats = response.model_extra[STATS_FIELD]
    assert stats["method"] == DEFAULT_METHOD
    assert stats["generated_tokens"] == MAX_TOKENS
    assert stats["tokens_per_target_forward"] >= 1.0


def test_chat_completion_streaming_with_openai_client(client, references):
    chunks = list(
        client.chat.completions.create(
            model="default_model", messages=CHAT, max_tokens=MAX_TOKENS, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == references["chat"]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra[STATS_FIELD]["generated_tokens"] == MAX_TOKENS


def test_chat_completion_non_streaming_with_request_options(client, references):
    response = client.chat.completions.create(
        model="default_model",
        messages=CHAT,
        max_tokens=MAX_TOKENS,
        extra_body={"speculative": "draft", "num_draft_tokens": 2},
    )
    assert response.choices[0].message.content == references["chat"]
    stats = response.model_extra[STATS_FIELD]
    assert stats["num_draft_tokens"] == 2


def test_per_request_method_none(client, references):
    response = client.completions.create(
        model="default_model",
        prompt=PROMPTS[1],
        max_tokens=MAX_TOKENS,
        extra_body={"speculative": "none"},
    )
    assert response.choices[0].text == references[PROMPTS[1]]
    assert response.model_extra[STATS_FIELD]["method"] == "none"


def test_streaming_completion_with_usage(client, references):
    chunks = list(
        client.completions.create(
            model="default_model",
            prompt=PROMPTS[2],
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == references[PROMPTS[2]]
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS
    assert STATS_FIELD in chunks[-1].model_extra


def test_models_endpoint(client, checkpoints):
    ids = [m.id for m in client.models.list().data]
    assert str(checkpoints["llama"].resolve()) in ids


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_draft_tokens", 0),
        ("num_draft_tokens", 65),
        ("num_draft_tokens", "four"),
        ("speculative", "bogus"),
        ("speculative", 3),
        ("tree_budget", 0),
        ("tree_top_k", 99),
        ("tree_choices", "[[1], [1, 2, 3]]"),
        ("ngram_max", 99),
        ("adaptive", "yes"),
        ("max_tokens", -1),
    ],
)
def test_bad_request_values_get_400_json(server, field, value):
    status, body = _post(server, "/v1/completions", {"prompt": "x", field: value})
    assert status == 400
    assert isinstance(body["error"], str) and body["error"]


def test_bad_json_gets_400(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request(
        "POST", "/v1/completions", body=b"{not json", headers={"Content-Length": "9"}
    )
    response = connection.getresponse()
    assert response.status == 400
    assert "error" in json.loads(response.read())
    connection.close()


def test_concurrent_requests_each_equal_plain_greedy(server, references):
    results = {}

    def ask(prompt, method):
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "speculative": method}
        results[prompt] = _post(server, "/v1/completions", body)

    # Mixed methods: caches with and without the draft's layers never mix.
    methods = ["draft", "none", "draft", "none"]
    threads = [
        threading.Thread(target=ask, args=(p, m)) for p, m in zip(PROMPTS, methods)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for prompt in PROMPTS:
        status, body = results[prompt]
        assert status == 200
        assert body["choices"][0]["text"] == references[prompt]


def test_client_disconnect_mid_stream_leaves_server_healthy(server, references):
    body = json.dumps(
        {"prompt": PROMPTS[3], "max_tokens": 400, "stream": True}
    ).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    received = b""
    while b"data:" not in received:
        received += sock.recv(4096)
    sock.close()

    status, answer = _post(
        server, "/v1/completions", {"prompt": PROMPTS[3], "max_tokens": MAX_TOKENS}
    )
    assert status == 200
    assert answer["choices"][0]["text"] == references[PROMPTS[3]]
    with urllib.request.urlopen(server.url + "/health", timeout=30) as response:
        assert json.loads(response.read()) == {"status": "ok"}


@pytest.mark.parametrize("method", METHODS)
def test_every_method_per_request_equals_plain_greedy(server, references, method):
    status, body = _post(
        server,
        "/v1/completions",
        {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "speculative": method},
    )
    assert status == 200, body
    assert body["choices"][0]["text"] == references[PROMPTS[0]]
    if method != "auto":
        assert body[STATS_FIELD]["method"] == method


def test_sampled_requests_with_a_seed_are_reproducible(server):
    body = {
        "prompt": PROMPTS[2],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": 7,
    }
    first = _post(server, "/v1/completions", body)
    second = _post(server, "/v1/completions", body)
    assert first[0] == second[0] == 200
    assert first[1]["choices"][0]["text"] == second[1]["choices"][0]["text"]
    assert first[1][STATS_FIELD]["method"] == DEFAULT_METHOD
