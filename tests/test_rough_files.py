"""Issue 18, the files gpumem reads: every reproducer of the issue as a test. Each bad input is one line
``gpumem: error: <where>: <problem>`` and exit 2 (or a clean GpumemInputError), never a traceback or a
hang; a shard given alone is read with its whole checkpoint; GGUF data regions are checked as llama.cpp
checks them."""

from __future__ import annotations

import json
import math
import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpumem_gui.cli import main as cli_main
from gpumem_gui.core import GpumemInputError, load_model
from gpumem_gui.core.readers.safetensors import inventory_from_safetensors
from gpumem_gui.core.readers.weights import classify_tensor
from tests.conftest import REPO
from tests.rough_inputs import (
    F32,
    LLAMA_CONFIG,
    LLAMA_GGUF_TENSORS,
    STRING,
    U32,
    gguf_bytes,
    huge_int_json,
    llama_gguf_kvs,
    nested_json,
    sharded_model,
)
from tests.safetensors_files import LLAMA, write_st


def _one_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI in this process; it must print one short error line and return 2."""
    rc = cli_main(list(argv))
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("gpumem: error: "), err
    assert len(lines[0]) < 700, lines[0]  # the longest of ours lists the supported model types
    return lines[0]


def _cli_subprocess(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process with a 2 GiB address-space limit and a timeout: an input that makes
    it block or read without end fails the test instead of hanging or exhausting the machine."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    code = "import sys; from gpumem_gui.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )


def _model(folder: Path, cfg: dict | str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return folder


# ---- 1, 2: integer literals over 4,300 digits, deep nesting ------------------------------------------------


def test_a_huge_integer_in_config_json_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _model(tmp_path / "m", huge_int_json(LLAMA_CONFIG))
    line = _one_line(capsys, "inspect", str(folder))
    assert "config.json" in line and "4,300 digits" in line


def test_a_huge_integer_in_the_index_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sharded_model(tmp_path / "m", 2)
    index = tmp_path / "m" / "model.safetensors.index.json"
    index.write_text(huge_int_json(json.loads(index.read_text())))
    line = _one_line(capsys, "estimate", str(tmp_path / "m"))
    assert "model.safetensors.index.json" in line and "4,300 digits" in line


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_config_and_index_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    # 100 levels parse (under the recursion limit) and are refused by depth; 100,000 raise RecursionError
    folder = _model(tmp_path / "c", {**LLAMA_CONFIG, "rope_scaling": json.loads(nested_json(100))})
    if depth > 100:
        (folder / "config.json").write_text(nested_json(depth))
    assert "nested too deeply" in _one_line(capsys, "inspect", str(folder))
    sharded_model(tmp_path / "i", 2)
    (tmp_path / "i" / "model.safetensors.index.json").write_text(nested_json(depth))
    assert "nested too deeply" in _one_line(capsys, "inspect", str(tmp_path / "i"))


# ---- 3, 4: MoE top-k above the expert count; a Gemma-3 vision tower over 2^31 parameters -------------------

_MOE = {
    "mixtral": {"num_local_experts": 4},
    "qwen2_moe": {"num_experts": 4, "moe_intermediate_size": 8},
    "qwen3_moe": {"num_experts": 4, "moe_intermediate_size": 8},
    "deepseek_v3": {
        "n_routed_experts": 4,
        "moe_intermediate_size": 8,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 8,
    },
}


@pytest.mark.parametrize("model_type", sorted(_MOE))
def test_moe_top_k_above_the_expert_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model_type: str
) -> None:
    cfg = {**LLAMA_CONFIG, "model_type": model_type, "num_experts_per_tok": 9, **_MOE[model_type]}
    line = _one_line(capsys, "estimate", str(_model(tmp_path / model_type, cfg)))
    assert "field 'num_experts_per_tok': is 9, more than the 4 experts" in line


def test_gguf_moe_top_k_above_the_expert_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kvs = llama_gguf_kvs(expert_count=(U32, 4), expert_used_count=(U32, 9))
    tensors = [*LLAMA_GGUF_TENSORS, ("blk.0.ffn_gate_inp.weight", 16 * 4)]
    (tmp_path / "moe.gguf").write_bytes(gguf_bytes(kvs, tensors))
    line = _one_line(capsys, "inspect", str(tmp_path / "moe.gguf"))
    assert "field 'llama.expert_used_count': is 9, more than the 4 experts" in line


def test_a_gemma3_vision_tower_over_2_31_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = {k: v for k, v in LLAMA_CONFIG.items() if k not in ("model_type", "tie_word_embeddings")}
    vision = {
        "hidden_size": 4096,
        "intermediate_size": 16384,
        "num_hidden_layers": 10,
        "num_attention_heads": 16,
    }
    cfg = {"model_type": "gemma3", "text_config": {**text, "head_dim": 8}, "vision_config": vision}
    line = _one_line(capsys, "estimate", str(_model(tmp_path / "g", cfg)))
    assert "field 'vision_config': the SigLIP tower would have 2,219,134,976 parameters" in line
    vision["num_hidden_layers"] = 9  # 2.02 B: within the bound, estimated
    (tmp_path / "g" / "config.json").write_text(json.dumps({**cfg, "vision_config": vision}))
    assert load_model(tmp_path / "g").params.vision > 2 * 10**9


# ---- 5: a GGUF integer key stored as FLOAT32 inf, a 5,000-digit layer number -------------------------------


@pytest.mark.parametrize(("value", "shown"), [(math.inf, "inf"), (math.nan, "nan"), (1.5, "1.5")])
def test_a_gguf_integer_key_stored_as_a_float(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: float, shown: str
) -> None:
    (tmp_path / "f.gguf").write_bytes(
        gguf_bytes(llama_gguf_kvs(block_count=(F32, value)), LLAMA_GGUF_TENSORS)
    )
    line = _one_line(capsys, "inspect", str(tmp_path / "f.gguf"))
    assert f"field 'llama.block_count': must be an integer, got {shown}" in line


def test_a_gguf_float_key_must_be_finite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kvs = llama_gguf_kvs(**{"attention.layer_norm_rms_epsilon": (F32, math.inf)})
    (tmp_path / "f.gguf").write_bytes(gguf_bytes(kvs, LLAMA_GGUF_TENSORS))
    assert "must be a finite number, got inf" in _one_line(capsys, "inspect", str(tmp_path / "f.gguf"))


def test_a_5000_digit_layer_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"blk.{'9' * 5000}.attn_norm.weight"
    (tmp_path / "l.gguf").write_bytes(gguf_bytes(llama_gguf_kvs(), [*LLAMA_GGUF_TENSORS, (name, 16)]))
    # llama.cpp refuses names of GGML_MAX_NAME (64) bytes or more, and so does the reader
    assert "tensor 3 has a name of 5,021 bytes" in _one_line(capsys, "inspect", str(tmp_path / "l.gguf"))
    # safetensors names have no such limit: the tensor keeps its component and no layer
    assert classify_tensor(f"model.layers.{'9' * 5000}.mlp.up_proj.weight") == ("mlp", None)
    assert classify_tensor("model.layers.12.mlp.up_proj.weight") == ("mlp", 12)
    f = write_st(tmp_path / "x.safetensors", {f"model.layers.{'7' * 5000}.mlp.up_proj.weight": ("F32", [2])})
    assert inventory_from_safetensors(f).bytes_by_component["mlp"] == 8


# ---- 6: unreadable paths -----------------------------------------------------------------------------------


def test_an_unreadable_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder without search permission: Path.is_file raises PermissionError inside it. Root passes every
    permission check, so as root the test drops to an unprivileged effective uid for the read (a real
    permission check by the kernel, not a stand-in)."""
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpumem-perm-{os.getpid()}"
    locked = _model(base / "locked", LLAMA_CONFIG)
    os.chmod(base, 0o755)
    os.chmod(locked, 0o000)
    try:
        if os.geteuid() == 0:
            os.seteuid(65534)  # nobody
        try:
            line = _one_line(capsys, "inspect", str(locked))
        finally:
            if os.getuid() == 0:
                os.seteuid(0)
    finally:
        os.chmod(locked, 0o755)
        (locked / "config.json").unlink()
        locked.rmdir()
        base.rmdir()
    assert f"{locked}: cannot read: Permission denied" in line


def test_paths_whose_stat_fails_for_other_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ENOTDIR (a path through a file) and ENAMETOOLONG (a component over 255 bytes): pathlib raises the
    latter from exists(); both are no file, so the name is looked up as a model id, in one line."""
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file" / "config.json", tmp_path / ("a" * 300) / "config.json"):
        assert "not a file or folder" in _one_line(capsys, "inspect", str(path))


# ---- 7: no hangs: FIFOs, /dev/zero, size caps --------------------------------------------------------------


def test_a_fifo_never_blocks(tmp_path: Path) -> None:
    for name in ("fifo.json", "model.safetensors", "model.gguf"):
        os.mkfifo(tmp_path / name)
        proc = _cli_subprocess("inspect", name, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"gpumem: error: {name}: is not a regular file"), proc.stderr
    # in a folder, a FIFO config.json is ignored and said so
    folder = tmp_path / "m"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    proc = _cli_subprocess("inspect", "m", cwd=tmp_path)
    assert proc.returncode == 2 and "(ignored (not a regular file): config.json)" in proc.stderr, proc.stderr


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_links_to_dev_zero_are_refused_before_reading(tmp_path: Path) -> None:
    for name in ("zero.json", "zero.safetensors", "zero.gguf"):
        (tmp_path / name).symlink_to("/dev/zero")
        proc = _cli_subprocess("inspect", name, cwd=tmp_path)
        assert proc.returncode == 2 and "is not a regular file" in proc.stderr, proc.stderr
    sharded_model(tmp_path / "m", 2)
    index = tmp_path / "m" / "model.safetensors.index.json"
    index.unlink()
    index.symlink_to("/dev/zero")
    proc = _cli_subprocess("estimate", "m", cwd=tmp_path)
    assert proc.returncode == 2 and "index.json: is a device, not a safetensors index" in proc.stderr


def test_a_config_json_over_its_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path / "m", LLAMA_CONFIG)
    with (folder / "config.json").open("r+b") as f:
        f.truncate(17 << 20)  # sparse: nothing is written, and nothing may be read
    line = _one_line(capsys, "inspect", str(folder))
    assert "config.json: is 17,825,792 bytes; a config.json is at most 16,777,216 bytes here" in line


# ---- 8: wrong numbers: a shard read alone; GGUF data regions -----------------------------------------------


def _bytes_of(capsys: pytest.CaptureFixture[str], *argv: str) -> int:
    assert cli_main(["estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["total_bytes"]


@pytest.mark.parametrize("index", [True, False])
def test_a_shard_given_alone_reads_the_whole_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], index: bool
) -> None:
    shards = sharded_model(tmp_path / "m", 4, index=index)
    whole = load_model(tmp_path / "m")
    one = load_model(shards[0])
    assert one.weights is not None and whole.weights is not None
    assert one.weights.total_bytes == whole.weights.total_bytes == 6080
    assert [Path(f).name for f in one.weights.files] == [s.name for s in shards]
    assert "model-00001-of-00004.safetensors is one of 4 shards: read with all of them" in one.notes
    assert _bytes_of(capsys, str(shards[0]), "--weights", "file") == _bytes_of(
        capsys, str(tmp_path / "m"), "--weights", "file"
    )


@pytest.mark.parametrize("index", [True, False])
def test_a_shard_with_missing_siblings_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], index: bool
) -> None:
    shards = sharded_model(tmp_path / "m", 4, index=index)
    shards[2].unlink()
    shards[3].unlink()
    line = _one_line(capsys, "estimate", str(shards[0]))
    assert "model-00003-of-00004.safetensors, model-00004-of-00004.safetensors" in line
    assert ("the weight_map names shards that do not exist" if index else "one of 4 shards") in line


def _gguf(tmp_path: Path, offsets: list[int] | None, cut: int = 0) -> Path:
    data = gguf_bytes(llama_gguf_kvs(), LLAMA_GGUF_TENSORS, offsets)
    (tmp_path / "m.gguf").write_bytes(data[: len(data) - cut])
    return tmp_path / "m.gguf"


@pytest.mark.parametrize(
    ("offsets", "cut", "words"),
    [
        # token_embd (2,048 bytes) at 0, the two 64-byte norms at 2,048 and 2,112: what the writer lays out
        ([0, 0, 0], 0, "tensor 'blk.0.attn_norm.weight': data offset 0, expected 2048 (it overlaps"),
        ([0, 2048, 2048], 0, "tensor 'output_norm.weight': data offset 2048, expected 2112 (it overlaps"),
        ([0, 2112, 2176], 0, "data offset 2112, expected 2048 (it leaves a gap"),
        ([0, 2048, 2120], 0, "data offset 2120 is not a multiple of the alignment 32"),
        (None, 1, "file is truncated: tensor 'output_norm.weight' data ends at byte"),
    ],
)
def test_gguf_data_regions_are_checked_as_llama_cpp_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], offsets: list[int] | None, cut: int, words: str
) -> None:
    assert load_model(_gguf(tmp_path, None)).weights.total_bytes == 2048 + 64 + 64  # the layout it checks
    assert words in _one_line(capsys, "inspect", str(_gguf(tmp_path, offsets, cut)))


# ---- 9: short echoes; folders named like files; stray non-files --------------------------------------------


def test_a_100_kb_value_is_not_echoed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path / "m", {**LLAMA_CONFIG, "hidden_size": "x" * 100_000})
    line = _one_line(capsys, "inspect", str(folder))
    assert "field 'hidden_size': must be an integer, got 'xxx" in line and "x" * 100 not in line
    folder = _model(tmp_path / "k", {**LLAMA_CONFIG, "model_type": "y" * 100_000})
    assert "y" * 100 not in _one_line(capsys, "inspect", str(folder))
    assert "z" * 200 not in _one_line(capsys, "inspect", "z" * 100_000)
    twice = [("k" * 100_000, STRING, "v")] * 2
    (tmp_path / "n.gguf").write_bytes(gguf_bytes([*llama_gguf_kvs(), *twice], LLAMA_GGUF_TENSORS))
    line = _one_line(capsys, "inspect", str(tmp_path / "n.gguf"))
    assert "appears twice" in line and "k" * 100 not in line


def test_a_folder_named_like_a_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model.gguf").mkdir()
    line = _one_line(capsys, "inspect", str(tmp_path / "model.gguf"))
    assert "model.gguf: is a folder, not a .gguf file, and it holds nothing usable" in line
    # inside a folder it is passed over and named
    line = _one_line(capsys, "inspect", str(tmp_path))
    assert "holds nothing usable" in line and "(ignored (not a regular file): model.gguf)" in line


def test_a_stray_safetensors_folder_does_not_spoil_a_model(tmp_path: Path) -> None:
    folder = _model(tmp_path / "m", LLAMA_CONFIG)
    (folder / "old.safetensors").mkdir()
    m = load_model(folder)  # a config alone, and a stray folder
    assert m.spec is not None and m.weights is None
    assert m.notes == ("ignored (not a regular file): old.safetensors",)
    write_st(folder / "model.safetensors", LLAMA)
    m = load_model(folder)
    assert m.weights is not None and m.weights.total_bytes == 6080 and m.notes[-1].endswith("old.safetensors")


def test_load_model_raises_only_input_errors_for_odd_paths(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "p.json")
    for source in (
        "~no-such-user-xyz/config.json",
        "a\0b",
        tmp_path / "p.json",
        tmp_path / "file" / "x.gguf",
    ):
        with pytest.raises(GpumemInputError):
            load_model(source)


def test_gguf_metadata_is_read_within_its_caps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def sparse(name: str, head: bytes, size: int) -> str:
        (tmp_path / name).write_bytes(head)
        with (tmp_path / name).open("r+b") as f:
            f.truncate(size)  # a hole: the bytes a crafted header claims, never written
        return str(tmp_path / name)

    key = struct.pack("<Q", 12) + b"general.name"
    one_string = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key + struct.pack("<IQ", STRING, 200 << 20)
    line = _one_line(capsys, "inspect", sparse("s.gguf", one_string, 201 << 20))
    assert "the header runs past 128 MiB (gpumem's cap for GGUF metadata) inside the value of" in line
    many = b"GGUF" + struct.pack("<IQQ", 3, 65_537, 0)
    line = _one_line(capsys, "inspect", sparse("t.gguf", many, 4 << 20))
    assert "header claims 0 metadata entries and 65,537 tensors; gpumem reads at most" in line
