"""`make serve`'s command line (tasks/serving.py); the server itself: tests/e2e/test_serve.py."""

from tasks.config import load_settings
from tasks.serving import SERVED_NAME, serve_command


def test_vllm_serve_on_loopback_with_the_models_tool_parser():
    s = load_settings(environ={}, overrides={"model": {"tool_call_parser": "llama3_json", "max_len": 1024}})
    cmd = serve_command(s, "/models/champion", 8123)
    assert "vllm.entrypoints" in cmd[2] and cmd[cmd.index("--model") + 1] == "/models/champion"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "8123"
    assert "--enable-auto-tool-choice" in cmd and cmd[cmd.index("--tool-call-parser") + 1] == "llama3_json"
    assert cmd[cmd.index("--served-model-name") + 1] == SERVED_NAME
    assert cmd[cmd.index("--max-model-len") + 1] == "1024" and "--trust-remote-code" not in cmd
