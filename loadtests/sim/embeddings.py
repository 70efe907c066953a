"""`/v1/embeddings`: deterministic unit vectors, float or base64, after a simulated delay."""

from __future__ import annotations

import array
import asyncio
import base64
import random
import secrets
import time

from starlette.requests import Request
from starlette.responses import Response

from . import float32, protocol, wire
from .asgi import DropResponse, json_response
from .protocol import EmbeddingRequest, RequestError
from .state import Sim
from .textgen import derive_seed, split_pieces


def _embed(seed_parts: object, dim: int, out_dim: int) -> array.array[float]:
    """A unit vector drawn from a hash of the input; truncated first (Matryoshka-style)."""
    rng = random.Random(derive_seed("embed", dim, seed_parts))
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)][:out_dim]
    norm = sum(x * x for x in vec) ** 0.5 or 1.0
    return array.array("f", [x / norm for x in vec])


def _embed_all(
    inputs: list[str | list[int]], dim: int, out_dim: int, fmt: str
) -> list[float32.Values | str]:
    """float: vLLM writes the float32 values with orjson (0.33 always, 0.28 when orjson is
    importable, as in its image), each as its shortest decimal."""
    data: list[float32.Values | str] = []
    for x in inputs:
        vec = _embed(x if isinstance(x, str) else tuple(x), dim, out_dim)
        data.append(
            base64.b64encode(vec.tobytes()).decode() if fmt == "base64" else float32.shortest(vec)
        )
    return data


async def embeddings(sim: Sim, request: Request) -> Response:
    sim.stats.requests += 1
    gated = sim.gate()
    if gated is not None:
        return gated
    try:
        req = sim.parse(EmbeddingRequest, await request.body())
        sim.check_model(req.model)
        raw = req.input
        inputs: list[str | list[int]]
        if isinstance(raw, str):
            inputs = [raw]
        elif raw and all(isinstance(x, int) for x in raw):
            inputs = [[int(x) for x in raw]]  # type: ignore[arg-type]
        else:
            inputs = [x if isinstance(x, str) else [int(t) for t in x] for x in raw]  # type: ignore[union-attr]
        if not inputs:
            raise protocol.bad_request("Input must not be empty.", "input")
        dim = sim.embed_dim
        out_dim = dim if req.dimensions is None else req.dimensions
        if not 1 <= out_dim <= dim:
            raise protocol.bad_request(
                f"dimensions must be between 1 and {dim}, got {out_dim}.", "dimensions"
            )
        if req.encoding_format not in ("float", "base64"):
            raise protocol.bad_request(
                f"encoding_format {req.encoding_format!r} is not supported by the simulator.",
                "encoding_format",
            )
        # The embedding model appends an end-of-text token to every input.
        counts = [(len(split_pieces(x)) if isinstance(x, str) else len(x)) + 1 for x in inputs]
        for c in counts:
            if c > sim.profile.max_model_len:
                raise protocol.bad_request(
                    f"This model's maximum context length is {sim.profile.max_model_len} tokens. "
                    f"However, your request has {c} input tokens. Please reduce the length of the "
                    "input messages.",
                    "input_tokens",
                )
    except RequestError as err:
        sim.stats.errors += 1
        return json_response(err.body, err.status)
    if sim.drop_after() is not None:
        return DropResponse()
    await sim.engine.wait_unpaused()  # the `hang` fault holds embeddings too
    total = sum(counts)
    delay = (
        sim.profile.step_seconds(1) + total / sim.profile.embed_tokens_per_s
    ) * sim.config.time_scale
    await asyncio.sleep(delay)
    fmt = req.encoding_format
    if len(inputs) > 8:  # ~0.3 ms per vector: a big batch goes to a thread, not the loop
        data = await asyncio.to_thread(_embed_all, inputs, dim, out_dim, fmt)
    else:
        data = _embed_all(inputs, dim, out_dim, fmt)
    sim.stats.completed += 1
    sim.metrics.prompt_tokens.inc(total)
    body = wire.embedding_response(
        request_id=f"embd-{secrets.token_hex(8)}",
        created=int(time.time()),
        model=sim.model,
        data=data,
        prompt_tokens=total,
    )
    return json_response(body)
