"""The servers of the load benchmark: each one a real process on a loopback port."""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

START_TIMEOUT = 300.0
LAUNCH = (
    "import mlx_spec, runpy, sys; sys.argv = [sys.argv[1]] + sys.argv[2:]; "
    "runpy.run_module(sys.argv[0], run_name='__main__')"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerFailed(RuntimeError):
    """A server that exited or did not start; the message ends with its log's path."""


def last_line(path: Path) -> str:
    """The last non-empty line of a log (a server's one-line error), else ``""``."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


class ServerProcess:
    """One server in a subprocess on a loopback port; its log in ``log_path``."""

    def __init__(self, name: str, module: str, args: Sequence[str], log_dir: Path):
        self.name = name
        self.port = free_port()
        argv = [sys.executable, "-c", LAUNCH, module, *args]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        env = dict(os.environ)
        if module.startswith("mlx_lm"):
            env["MLX_SPEC_DISABLE"] = "1"  # mlx-lm's own server, not the hook's
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        self.argv = argv

    def wait_ready(self, timeout: float = START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._log.flush()
                raise ServerFailed(
                    f"{self.name} exited ({last_line(self.log_path)}); "
                    f"see {self.log_path}"
                )
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise ServerFailed(f"{self.name} did not start; see {self.log_path}")

    def rss_mb(self) -> Optional[float]:
        """Resident memory of the server process, in MB."""
        status = Path(f"/proc/{self.process.pid}/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        out = subprocess.run(
            ["ps", "-o", "rss=", "-p", str(self.process.pid)],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return int(out) / 1024 if out else None

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()


def mlx_lm_draft_model(target: str, draft: str, out: Path):
    """``(path, note)``: an mlx-spec drafter directory as mlx_lm.server can load it.

    A distilled draft is written as a plain mlx-lm checkpoint in
    ``OUT/mlx_lm_draft_model`` (full-width output layer); a head has no
    mlx-lm form, so the path is ``None``.
    """
    from mlx_lm import load

    from mlx_spec.drafters.distilled import is_draft_dir, save_as_mlx_lm
    from mlx_spec.loading import load_draft

    if not is_draft_dir(draft):
        return None, (
            f"mlx_lm_draft not run: `{draft}` is a head, which mlx_lm.server "
            "cannot load."
        )
    model, tokenizer = load(target)
    path = save_as_mlx_lm(
        load_draft(draft, model, tokenizer), target, out / "mlx_lm_draft_model"
    )
    return str(path), (
        f"mlx_lm_draft runs `{draft}` written as a plain mlx-lm checkpoint "
        "(its output layer widened to the full vocabulary, as mlx-lm needs)."
    )


def server_command(
    name: str, target: str, draft: Optional[str], method: str, spec_extra=()
):
    """``(module, args)`` of a named server configuration.

    ``spec_extra`` are further flags of the mlx_spec servers.
    """
    if name == "mlx_lm":
        return "mlx_lm.server", ["--model", target]
    if name == "mlx_lm_draft":
        return "mlx_lm.server", ["--model", target, "--draft-model", draft]
    args = ["--model", target, "--speculative", method]
    if draft is not None:
        args += ["--draft-model", draft]
    if name == "mlx_spec_alone":
        args.append("--no-batching")
    return "mlx_spec.serve.server", [*args, *spec_extra]


def has_chat_template(model_path: str) -> bool:
    path = Path(model_path)
    if (path / "chat_template.jinja").exists():
        return True
    config = path / "tokenizer_config.json"
    if config.exists():
        return bool(json.loads(config.read_text()).get("chat_template"))
    return False


def start_servers(names, target, draft, method, out, spec_extra=(), lm_draft=None):
    """Start the named servers; ``mlx_lm_draft`` loads ``lm_draft`` if given."""
    servers = {}
    try:
        for name in names:
            own = lm_draft if name == "mlx_lm_draft" and lm_draft else draft
            module, sargs = server_command(name, target, own, method, spec_extra)
            servers[name] = ServerProcess(name, module, sargs, out / "logs")
        for server in servers.values():
            server.wait_ready()
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers
