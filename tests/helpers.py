"""Shared test helpers (plain functions; fixtures live in conftest.py)."""

import contextlib
import json
import socket
import threading
import time

import numpy as np
from safetensors.numpy import save_file


@contextlib.contextmanager
def running_server(app, **config):
    """A real uvicorn server on a free 127.0.0.1 port, in a background thread; ``config``: more
    ``uvicorn.Config`` settings."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def write_peft(folder, weights, r=8, alpha=16, **config):
    """Write ``weights`` (AdapterWeights) as a peft adapter folder with extra config fields."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path, (a, b) in weights.modules.items():
        tensors[f"base_model.model.{path}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"base_model.model.{path}.lora_B.weight"] = np.ascontiguousarray(b.T)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": ["q_proj", "v_proj"], **config}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def assert_same_adam_updates(got, want, lr: float, steps: int, label: str = "") -> None:
    """Two adapters trained by the same AdamW steps on the same turns through different batchings.
    Float32 sums in another order change a gradient in its last bits; Adam divides by the gradient's
    own scale, so where a gradient element is near its rounding error its update can move anywhere
    within the step bound lr, and later steps start from slightly different weights. The check:
    every element within the bound (2 * lr * steps), and all but 1 in 100 within 1% of the steps'
    total (a wrong gradient moves most elements by about lr)."""
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = np.abs(got - want)
    bound = 2 * lr * steps
    assert diff.max() <= bound, f"{label}: an element moved {diff.max():.3g}, past the step bound {bound:.3g}"
    far = float(np.mean(diff > 1e-2 * lr * steps))
    assert far <= 1e-2, f"{label}: {far:.2%} of the elements differ by more than 1% of the steps' total"


@contextlib.contextmanager
def hub_transport(respond):
    """huggingface_hub's HTTP client answered by ``respond(request, httpx)`` instead of the network
    (an httpx mock transport), restored afterwards."""
    import huggingface_hub
    from huggingface_hub.utils import _http

    httpx = __import__(type(_http.get_session()).__module__.split(".")[0])
    old = _http._GLOBAL_CLIENT_FACTORY
    huggingface_hub.set_client_factory(
        lambda: httpx.Client(transport=httpx.MockTransport(lambda request: respond(request, httpx))))
    huggingface_hub.close_session()
    try:
        yield
    finally:
        huggingface_hub.set_client_factory(old)
        huggingface_hub.close_session()


def example_module(name: str):
    """``examples/NAME.py`` as the module ``NAME``, as the examples import each other (``from
    credit_variants import ...``): loaded once, so its classes are the ones the examples use."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def load_script(path, name: str):
    """A script of examples/ or research/ as a module named ``name``, without running its command line
    (registered only while it loads: dataclasses look their module up while the class is built)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    before = sys.modules.get(name)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if before is None:
            del sys.modules[name]
        else:
            sys.modules[name] = before
    return module
