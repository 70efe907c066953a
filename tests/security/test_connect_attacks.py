"""`specrouter connect` against a hostile gateway and a hostile home directory: the real command
(a subprocess, a temporary HOME) asking a loopback gateway of this file's own, whose /models
answers with model ids holding a newline, a quote or a terminal escape, drips its answer, or
sends megabytes; and `--write` into a home where config.toml is a link to a private file, links
are planted where a temporary file might go, and `--ca` names a key."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.certs import CertFiles
from proxy.ops.connect.gateway import MAX_MODELS_BYTES, ConnectError, ca_certificates
from tests.security.loopback_engine import LoopbackEngine

ROOT = Path(__file__).resolve().parents[2]
MARK = "connect-pwned"  # a file the hostile model ids try to create when a shell reads them
MODELS = {  # path prefix -> the model ids the gateway serves
    "/newline": [f"m\ntouch {MARK}\n#"],
    "/escape": ["m\x1b]0;owned\x07\x1b[2J"],
    "/quote": [f"m'\"); import os; os.system('touch {MARK}'); (\"'; touch {MARK}; '"],
    "/ok": ["coder"],
}


class HostileGateway(LoopbackEngine):
    """GET PREFIX/v1/models as PREFIX says: a model list (MODELS), `/drip` a byte at a time
    from the status line on, `/huge` a valid list padded past MAX_MODELS_BYTES."""

    async def answer(
        self, w: asyncio.StreamWriter, line: str, headers: dict[str, str], body: bytes
    ) -> bool:
        prefix = "/" + line.split(" ")[1].split("/")[1]
        if prefix == "/drip":
            for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 40\r\n\r\n" + b" " * 40:
                w.write(bytes([byte]))
                await w.drain()
                await asyncio.sleep(0.2)
            return False
        if prefix == "/huge":
            payload = {"data": [{"id": "coder"}], "pad": "x" * (MAX_MODELS_BYTES + 1)}
        else:
            payload = {"data": [{"id": m, "object": "model"} for m in MODELS[prefix]]}
        out = json.dumps(payload).encode()
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        w.write(f"content-length: {len(out)}\r\n\r\n".encode() + out)
        return False


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    with HostileGateway() as gw:
        yield gw.url


def connect(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SPECROUTER_", "CODEX_"))}
    clean.pop("XDG_CONFIG_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "connect", *args, "--key", "sk-test"],
        cwd=home,
        env={**clean, "HOME": str(home), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refused(done: subprocess.CompletedProcess[str], why: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert why in done.stderr and "Traceback" not in done.stderr, done.stderr


def sourced(home: Path, env_file: Path) -> str:
    """What `source FILE` leaves in a POSIX shell's environment (OPENAI_*), run in `home`."""
    done = subprocess.run(
        ["sh", "-c", f'. {shlex.quote(str(env_file))} && echo "$OPENAI_API_KEY"'],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=10,
    )
    return done.stdout


@pytest.mark.parametrize("prefix", ["/newline", "/escape"])
def test_a_model_id_with_a_control_character_is_refused_and_never_sourced(
    tmp_path: Path, gateway: str, prefix: str
) -> None:
    done = connect(tmp_path, "openai", "--url", gateway + prefix, "--write")
    env_file = tmp_path / ".config" / "specrouter" / "openai.env"
    if env_file.exists():  # what the documented next step would run
        sourced(tmp_path, env_file)
    assert not (tmp_path / MARK).exists(), "the gateway's model id ran as a command"
    refused(done, "holds a control character")
    assert "\x1b" not in done.stdout + done.stderr, "a terminal escape printed raw"
    assert not env_file.exists()


def test_a_quote_in_a_model_id_stays_inside_its_quotes(tmp_path: Path, gateway: str) -> None:
    done = connect(tmp_path, "openai", "--url", gateway + "/quote", "--write")
    assert done.returncode == 0, done.stderr
    env_file = tmp_path / ".config" / "specrouter" / "openai.env"
    assert sourced(tmp_path, env_file) == "sk-test\n"
    assert not (tmp_path / MARK).exists()
    # the printed next step: `source FILE && python -c CODE`, CODE naming the model exactly
    then = done.stdout.split("Then:\n", 1)[1].strip()
    words = shlex.split(then)
    assert words[:3] == ["source", str(env_file), "&&"] and words[3:5] == ["python", "-c"]
    model = MODELS["/quote"][0]
    assert words[5:] == [
        f"import openai; print(openai.OpenAI().models.retrieve({json.dumps(model)}))"
    ]


def test_a_dripping_gateway_is_given_up_on_at_the_deadline(tmp_path: Path, gateway: str) -> None:
    done = connect(tmp_path, "codex", "--url", gateway + "/drip", "--timeout", "1", timeout=30)
    refused(done, "no whole answer within 1 s")


def test_a_huge_model_list_is_refused_unread(tmp_path: Path, gateway: str) -> None:
    refused(connect(tmp_path, "codex", "--url", gateway + "/huge"), f"over {MAX_MODELS_BYTES}")


def test_write_keeps_mode_owner_and_link_and_never_follows_a_planted_link(
    tmp_path: Path, gateway: str
) -> None:
    """~/.codex/config.toml: a link to the user's private dotfile, owned by the user; links
    planted where a fixed temporary name would be."""
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    config = home / ".codex" / "config.toml"
    dotfile = tmp_path / "dotfiles" / "codex.toml"
    dotfile.parent.mkdir()
    dotfile.write_text('[mcp_servers.x]\nenv = { TOKEN = "secret" }\n')
    dotfile.chmod(0o600)
    owner = (os.getuid(), os.getgid())
    if os.geteuid() == 0:  # root may give the file away: it must stay the user's
        owner = (4242, 4243)
        os.chown(dotfile, *owner)
    config.symlink_to(dotfile)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    for name in ("config.toml.tmp", "specrouter.config.toml.tmp"):
        (config.parent / name).symlink_to(victim)
    done = connect(home, "codex", "--url", gateway + "/ok", "--write")
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "untouched\n", "a planted link was written through"
    assert config.is_symlink() and config.readlink() == dotfile, "the link was replaced"
    text = dotfile.read_text()
    assert "[model_providers.specrouter]" in text and "secret" in text
    for path in (dotfile, *dotfile.parent.glob("codex.toml.bak-*")):
        st = path.stat()
        assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o600, *owner), path
    config.unlink()
    config.symlink_to(tmp_path / "dotfiles" / "gone.toml")
    refused(connect(home, "codex", "--url", gateway + "/ok", "--write"), "does not resolve")
    assert config.is_symlink() and not (tmp_path / "dotfiles" / "gone.toml").exists()


@pytest.mark.parametrize("check", [True, False], ids=["checked", "no-check"])
def test_a_ca_that_is_a_private_key_is_refused(
    tmp_path: Path, gateway: str, certs: CertFiles, check: bool
) -> None:
    args = ["--url", gateway + "/ok", "--ca", str(certs.key), "--write"]
    args += [] if check else ["--no-check", "--model", "coder"]
    refused(connect(tmp_path, "openai", *args), "holds a private key")
    assert not (tmp_path / ".config" / "specrouter").exists()


def test_a_ca_file_without_a_certificate_is_refused(tmp_path: Path, certs: CertFiles) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a certificate\n")
    with pytest.raises(ConnectError, match="is not a PEM certificate"):
        ca_certificates(notes)
    assert ca_certificates(certs.ca_cert) == certs.ca_cert.read_text()
