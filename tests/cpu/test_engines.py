"""The engine plug-ins against vLLM's and SGLang's own modules (unpacked by scripts/engines.sh, no engine
installed): their plug-in loaders find ours, vLLM resolves our platform and its classes, vLLM's own
communicator builds with our swap (and its own dispatch still sums right when ours declines), SGLang's
hooks wrap exactly the functions they should, and the fusion pass rewrites graphs that torch.compile
traced through vLLM's real ops. Each case runs in a fresh process, as an engine's worker would. The
adapters' size gates run here in-process, with no engine at all."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fused_ar.integrations import ENGINE_VERSIONS
from fused_ar.integrations.sglang import SglangCustomAllreduce
from fused_ar.integrations.vllm import VllmCustomAllreduce

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(engines_site: Path) -> Path:
    return engines_site


def run(site: Path, code: str, tmp_path: Path, plugin: str = "1", **env: str) -> str:
    """Runs `code` in a fresh interpreter with the engines' modules importable; returns stdout + stderr,
    failing the test (with both) on a non-zero exit."""
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), FUSED_AR_ENGINE_PLUGIN=plugin,
                   PYTHONUNBUFFERED="1", **env)
    script = tmp_path / f"case{len(list(tmp_path.glob('case*.py')))}.py"  # a file: spawned ranks re-import it
    script.write_text(textwrap.dedent(code))
    done = subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-6000:]}"
    return done.stdout + done.stderr


def test_the_pinned_engines_are_the_unpacked_ones(site):
    for name, version in ENGINE_VERSIONS.items():
        assert list(site.glob(f"{name}-{version}.dist-info")), f"{name} {version} is not what scripts/engines.sh unpacked"


# -- vLLM ----------------------------------------------------------------------------------------------------
def test_vllm_plugin_loaders_find_and_load_ours(site, tmp_path):
    out = run(site, """
        import torch
        from vllm.plugins import load_general_plugins, load_plugins_by_group
        print("general", "fused_ar" in load_plugins_by_group("vllm.general_plugins"))
        print("platform", "fused_ar" in load_plugins_by_group("vllm.platform_plugins"))
        load_general_plugins()
        load_general_plugins()  # idempotent
        print("ops", hasattr(torch.ops.fused_ar, "vllm_allreduce_rmsnorm"), hasattr(torch.ops.fused_ar, "allreduce_rmsnorm"),
              hasattr(torch.ops.fused_ar, "vllm_allreduce_rmsnorm_fp8"))
    """, tmp_path)
    assert "general True" in out and "platform True" in out
    assert "ops True True True" in out


@pytest.mark.parametrize("plugin, allowed, expected", [
    ("1", None, "fused_ar.integrations.vllm_platform.FusedArCudaPlatform"),
    ("0", None, "vllm.platforms.cuda.CudaPlatform"),
    ("1", "someone_else", "vllm.platforms.cuda.CudaPlatform"),   # VLLM_PLUGINS whitelists entry points
    ("1", "fused_ar", "fused_ar.integrations.vllm_platform.FusedArCudaPlatform"),
], ids=["on", "off", "not-whitelisted", "whitelisted"])
def test_vllm_resolves_our_platform_only_when_switched_on(site, tmp_path, plugin, allowed, expected):
    """vLLM's own resolution, on a machine its CUDA detection accepts (detection stubbed: no GPU here)."""
    env = {} if allowed is None else {"VLLM_PLUGINS": allowed}
    out = run(site, """
        import vllm.platforms as platforms
        platforms.builtin_platform_plugins["cuda"] = lambda: "vllm.platforms.cuda.CudaPlatform"
        print("resolved", platforms.resolve_current_platform_cls_qualname())
    """, tmp_path, plugin=plugin, **env)
    assert f"resolved {expected}\n" in out


def test_vllm_resolves_nothing_of_ours_without_a_gpu_platform(site, tmp_path):
    out = run(site, """
        import vllm.platforms as platforms
        from fused_ar.integrations.vllm import platform
        print("ours", platform(), "resolved", platforms.resolve_current_platform_cls_qualname())
    """, tmp_path)
    assert "ours None resolved vllm.platforms.interface.UnspecifiedPlatform" in out


def test_vllm_classes_derive_from_vllms_and_resolve_by_their_names(site, tmp_path):
    """The platform names our communicator (graph_capture asserts it is a CudaCommunicator) and pass manager;
    vLLM resolves each by qualname; they pickle by reference (Inductor keeps the pass manager in its config).
    vLLM's compiled module vllm._C_stable_libtorch, which needs libcuda, is stubbed to import the platform."""
    out = run(site, """
        import pickle, sys, types
        sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
        from vllm.utils.import_utils import resolve_obj_by_qualname
        from vllm.platforms.cuda import CudaPlatform
        from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator
        from vllm.compilation.passes.pass_manager import PostGradPassManager
        ours = resolve_obj_by_qualname("fused_ar.integrations.vllm_platform.FusedArCudaPlatform")
        comm = resolve_obj_by_qualname(ours.get_device_communicator_cls())
        manager = resolve_obj_by_qualname(ours.get_pass_manager_cls())
        print("platform", issubclass(ours, CudaPlatform), ours.__name__)
        print("communicator", issubclass(comm, CudaCommunicator), comm.__name__)
        print("manager", issubclass(manager, PostGradPassManager), manager.__name__)
        print("pickles", all(pickle.loads(pickle.dumps(c)) is c for c in (ours, comm, manager)))
    """, tmp_path)
    assert "platform True FusedArCudaPlatform" in out and "communicator True FusedArCudaCommunicator" in out
    assert "manager True FusedArPassManager" in out and "pickles True" in out


_GLOO = """
    import os, sys, tempfile, logging
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def worker(rank, world, init):
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
        try:
            body(rank, world)
            dist.barrier()  # no rank closes its gloo pairs while the other still uses them
        finally:
            dist.destroy_process_group()
        # Interpreter finalization can free a tensor that gloo's worker threads still hold and abort the process
        # (SIGABRT, "terminate called without an active exception") after everything ran right: the body's
        # outcome is decided, so the rank leaves without finalizing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def spawn(world):
        mp.spawn(worker, args=(world, tempfile.mkdtemp() + "/store"), nprocs=world)

    def say(*parts):  # one write: the ranks' lines never interleave
        sys.stdout.write(" ".join(map(str, parts)) + chr(10))
        sys.stdout.flush()
"""


def test_vllms_communicator_keeps_its_own_where_ours_cannot_serve_and_still_sums(site, tmp_path):
    """vLLM's CudaCommunicator (ours, subclassed) built over a real gloo group of 2 on this CPU: fused_ar's
    adapter cannot serve a CPU device, so vLLM's own custom all-reduce stays (one line says why) and vLLM's
    own all_reduce dispatch gives the right sum."""
    out = run(site, _GLOO + """
    def body(rank, world):
        import fused_ar.integrations.vllm_platform as vp
        dc = vp.FusedArCudaCommunicator(dist.group.WORLD, device=torch.device("cpu"), device_group=dist.group.WORLD,
                                        unique_name="tp:0")
        summed = dc.all_reduce(torch.full((4, 8), float(rank + 1)))
        say(rank, type(dc.ca_comm).__module__, float(summed[0, 0]))

    if __name__ == "__main__":
        spawn(2)
    """, tmp_path)
    assert "0 vllm.distributed.device_communicators.custom_all_reduce 3.0" in out
    assert "1 vllm.distributed.device_communicators.custom_all_reduce 3.0" in out
    assert out.count("keeps vLLM's custom all-reduce: device cpu is not a GPU torch can use") == 1


@pytest.mark.parametrize("world, reason", [(1, "a group of 1 ranks"), (2, "is not a GPU torch can use")])
def test_vllm_adapter_declines_what_it_cannot_serve_and_never_raises(site, tmp_path, world, reason):
    out = run(site, _GLOO + f"""
    def body(rank, world):
        from fused_ar.integrations.vllm import VllmCustomAllreduce
        ca = VllmCustomAllreduce(dist.group.WORLD, "cuda:0", name="tp:0")
        x = torch.ones(8, 8)
        with ca.capture():
            got = ca.custom_all_reduce(x)
        ca.close(); ca.close()
        say(rank, ca.disabled, ca.should_custom_ar(x), got, ca.mnnvl_only, ca.mnnvl_lamport_ag_multicast_ptr,
            ca.custom_all_gather(x), ca.custom_reduce_scatter(x), "|", ca.disabled_reason)

    if __name__ == "__main__":
        spawn({world})
    """, tmp_path)
    assert out.count("True False None False 0 None None |") == world, out
    assert reason in out


def test_vllm_compilation_config_resolves_the_exported_pass(site, tmp_path):
    """--compilation-config '{"inductor_passes": {"post_grad_custom_post_pass": "fused_ar.vllm_fusion_pass"}}':
    vLLM's own config code looks the name up in fused_ar's namespace and wraps it as an InductorPass."""
    out = run(site, """
        from vllm.config import CompilationConfig
        from vllm.compilation.passes.inductor_pass import InductorPass
        import fused_ar
        cc = CompilationConfig(inductor_passes={"post_grad_custom_post_pass": "fused_ar.vllm_fusion_pass"})
        p = cc.inductor_compile_config["post_grad_custom_post_pass"]
        print("pass", isinstance(p, InductorPass), p.callable is fused_ar.vllm_fusion_pass, len(p.uuid()) > 0)
        import sys
        print("torch-free import", "torch" in sys.modules)
    """, tmp_path)
    assert "pass True True True" in out


_TRACE = """
    import sys, torch, traceback
    import vllm.distributed.parallel_state  # torch.ops.vllm.all_reduce
    import vllm.ir.ops  # torch.ops.vllm_ir.*
    from fused_ar.integrations.vllm_fusion import op_name, rewrite

    # vLLM's compiled FP8 ops are GPU-only: the same schemas, defined here so torch.compile can trace them.
    lib = torch.library.Library("_C", "DEF")
    lib.define("static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, SymInt[]? group_shape=None) -> ()")
    lib.define("rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, Tensor scale, float epsilon) -> ()")
    lib.define("fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor! residual, Tensor weight, "
               "Tensor scale, float epsilon) -> ()")
    for name in ("static_scaled_fp8_quant", "rms_norm_static_fp8_quant", "fused_add_rms_norm_static_fp8_quant"):
        torch.library.impl(lib, name, "CompositeExplicitAutograd")(lambda *a, **k: None)

    def names(graph):
        return [(op_name(n.target) or getattr(n.target, "__name__", str(n.target))).split(".")[-1]
                for n in graph.nodes if n.op == "call_function"]

    seen = {}
    def post(graph):
        seen["count"] = rewrite(graph)
        seen["after"] = names(graph)
        graph.lint()
    torch._inductor.config.post_grad_custom_post_pass = post
    torch._inductor.config.enable_auto_functionalized_v2 = False  # as vLLM configures Inductor

    def compiled_calls(fn, *args):
        torch._dynamo.reset()
        try:  # no TP group and no GPU here: the first op the compiled code calls fails, and names itself
            torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False)(*args)
            ran = "ran"
        except Exception as exc:
            trace = traceback.format_exc()
            ran = "calls fused_ar" if "fused_ar::vllm_allreduce_rmsnorm" in str(exc) else \
                "calls vllm.all_reduce" if "torch.ops.vllm.all_reduce" in trace else repr(exc)[:300]
        print(CASE, seen["count"], ran, "|", " ".join(seen["after"]), flush=True)
"""

_CASES = {
    "fused_add": ("""
        def fn(x, r, w):
            return torch.ops.vllm_ir.fused_add_rms_norm(torch.ops.vllm.all_reduce(x, "tp:0"), r, w, 1e-6)
        """, "x, r, w", "1 calls fused_ar | vllm_allreduce_rmsnorm getitem getitem"),
    "rms_norm_keeps_the_sum": ("""
        def fn(x, r, w):
            ar = torch.ops.vllm.all_reduce(x, "tp:0")
            return torch.ops.vllm_ir.rms_norm(ar, w, 1e-5), ar
        """, "x, r, w", "1 calls fused_ar | vllm_allreduce_rmsnorm getitem getitem"),
    "gemma_fp32_weight": ("""
        def fn(x, r, w):
            ar = torch.ops.vllm.all_reduce(x, "tp:0")
            return torch.ops.vllm_ir.rms_norm(ar, w.float() + 1.0, 1e-6)
        """, "x, r, w", "1 calls fused_ar |"),
    "static_fp8": ("""
        def fn(x, r, w, s):
            out, res = torch.ops.vllm_ir.fused_add_rms_norm(torch.ops.vllm.all_reduce(x, "tp:0"), r, w, 1e-6)
            q = torch.empty(out.shape, dtype=torch.float8_e4m3fn)
            torch.ops._C.static_scaled_fp8_quant(q, out, s)
            return q, res
        """, "x, r, w, s", "1 calls fused_ar | vllm_allreduce_rmsnorm_fp8 getitem getitem"),
    "norm_and_quant_fused_by_vllm": ("""
        def fn(x, r, w, s):
            ar = torch.ops.vllm.all_reduce(x, "tp:0")
            q = torch.empty(ar.shape, dtype=torch.float8_e4m3fn)
            torch.ops._C.fused_add_rms_norm_static_fp8_quant(q, ar, r, w, s, 1e-6)
            return q, r
        """, "x, r.clone(), w, s", "1 calls fused_ar |"),
    "variance_size_is_not_ours": ("""
        def fn(x, r, w):
            return torch.ops.vllm_ir.fused_add_rms_norm(torch.ops.vllm.all_reduce(x, "tp:0"), r, w, 1e-6, 32)
        """, "x, r, w", "0 calls vllm.all_reduce"),
    "the_sum_used_twice": ("""
        def fn(x, r, w):
            ar = torch.ops.vllm.all_reduce(x, "tp:0")
            return torch.ops.vllm_ir.fused_add_rms_norm(ar, r, w, 1e-6), ar * 2
        """, "x, r, w", "0 calls vllm.all_reduce"),
    "fp16_weight_on_bf16": ("""
        def fn(x, r, w):
            return torch.ops.vllm_ir.fused_add_rms_norm(torch.ops.vllm.all_reduce(x, "tp:0"), r, w.half(), 1e-6)
        """, "x, r, w", "0 calls vllm.all_reduce"),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_the_fusion_pass_rewrites_graphs_traced_through_vllms_ops(site, tmp_path, case):
    """torch.compile (Inductor, on this CPU) traces vLLM's real all-reduce and RMSNorm ops; our rewrite runs
    as the post-grad pass and its result is linted and compiled. Chains it must not touch stay as they are."""
    body, args, expected = _CASES[case]
    hidden = 64
    out = run(site, _TRACE + f"""
    CASE = {case!r}
    {textwrap.indent(textwrap.dedent(body), '    ').strip()}
    x = torch.randn(8, {hidden}, dtype=torch.bfloat16); r = torch.randn_like(x); w = torch.randn({hidden}, dtype=torch.bfloat16)
    s = torch.tensor([0.5])
    compiled_calls(fn, {args})
    """, tmp_path)
    line = next(ln for ln in out.splitlines() if ln.startswith(case + " "))
    assert line.startswith(f"{case} {expected}"), line


def test_the_fusion_pass_leaves_rows_the_kernels_cannot_take(site, tmp_path):
    """n = 12 bf16 (24 bytes a row): not whole 16-byte packs, so the chain stays vLLM's."""
    out = run(site, _TRACE + """
    CASE = "short_rows"
    def fn(x, r, w):
        return torch.ops.vllm_ir.fused_add_rms_norm(torch.ops.vllm.all_reduce(x, "tp:0"), r, w, 1e-6)
    x = torch.randn(8, 12, dtype=torch.bfloat16)
    compiled_calls(fn, x, torch.randn_like(x), torch.randn(12, dtype=torch.bfloat16))
    """, tmp_path)
    assert "short_rows 0 " in out


def test_the_pass_serves_small_compile_ranges_and_stays_off_when_it_must(site, tmp_path):
    """fusion_pass: the token limit is the adapter's buffer over a row (and vLLM's batched-token limit); no
    pass with the plug-in off, in batch-invariant mode, or with no fused_ar adapter on the TP group."""
    code = """
        from types import SimpleNamespace as NS
        import torch
        from vllm.config.utils import Range
        from fused_ar.integrations.vllm_fusion import fusion_pass
        config = NS(model_config=NS(get_hidden_size=lambda: 4096, dtype=torch.bfloat16),
                    scheduler_config=NS(max_num_batched_tokens=8192))
        p = fusion_pass(config, NS(max_size=8 << 20))
        print("limit", p is not None and p.is_applicable_for_range(Range(1, 1024)), p is not None and
              p.is_applicable_for_range(Range(1, 1025)), p is not None and p.uuid() == fusion_pass(config, NS(max_size=8 << 20)).uuid())
        print("no adapter", fusion_pass(config, None))
    """
    on = run(site, code, tmp_path)
    assert "limit True False True" in on and "no adapter None" in on
    assert "limit False False False" in run(site, code, tmp_path, plugin="0")
    assert "limit False False False" in run(site, code, tmp_path, VLLM_BATCH_INVARIANT="1")


# -- SGLang --------------------------------------------------------------------------------------------------
_SGLANG = """
    import torch
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    import sglang.srt.distributed.device_communicators.custom_all_reduce as ca
    import sglang.srt.layers.flashinfer_comm_fusion as fusion
    before = {name: getattr(ca, name) for name in dir(ca)} | {"fusion." + n: getattr(fusion, n) for n in dir(fusion)}
    load_plugins()
    load_plugins()  # idempotent
    ours = sorted(t for t, hooks in HookRegistry._hooks.items() if any(h.__module__.startswith("fused_ar") for _, h, _ in hooks))
    print("hooks", ours)
    after = {name: getattr(ca, name) for name in dir(ca)} | {"fusion." + n: getattr(fusion, n) for n in dir(fusion)}
    print("changed", sorted(n for n in before if after[n] is not before[n] and not n.startswith("__")))
"""


def test_sglang_loads_our_plugin_and_hooks_exactly_its_targets(site, tmp_path):
    out = run(site, _SGLANG, tmp_path)
    assert "hooks ['sglang.srt.distributed.device_communicators.custom_all_reduce.dispatch_custom_allreduce', " \
           "'sglang.srt.layers.flashinfer_comm_fusion.flashinfer_allreduce_residual_rmsnorm', " \
           "'sglang.srt.layers.layer_boundary.residual.add_norm.flashinfer_ar_fusion_applies']" in out
    assert "changed ['dispatch_custom_allreduce', 'fusion.flashinfer_allreduce_residual_rmsnorm']" in out


def test_sglang_untouched_when_switched_off(site, tmp_path):
    out = run(site, _SGLANG, tmp_path, plugin="0")
    assert "hooks []" in out and "changed []" in out


def test_sglangs_dispatch_builds_ours_or_keeps_its_own(site, tmp_path):
    """SGLang's own dispatch_custom_allreduce (its CUDA branch), hooked, over a gloo group of 2: the factory
    tries fused_ar's adapter, which cannot serve this CPU, and builds SGLang's class instead, as
    parallel_state calls it (group=, device=)."""
    out = run(site, _GLOO + """
    def body(rank, world):
        from sglang.srt.plugins import load_plugins
        import sglang.srt.distributed.device_communicators.custom_all_reduce as ca
        load_plugins()
        ca._is_cuda = True  # SGLang's CUDA branch on this CPU machine
        cls = ca.dispatch_custom_allreduce(group=dist.group.WORLD, device=torch.device("cpu"))
        built = cls(group=dist.group.WORLD, device=torch.device("cpu"))
        say(rank, type(built).__module__, type(built).__name__, built.disabled)

    if __name__ == "__main__":
        spawn(2)
    """, tmp_path, SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2="0")
    assert "0 sglang.srt.distributed.device_communicators.custom_all_reduce CustomAllreduce True" in out
    assert out.count("SGLang keeps its own custom all-reduce: device cpu is not a GPU torch can use") == 1


def test_sglangs_fused_norm_falls_through_to_its_own_without_our_group(site, tmp_path):
    """No TP group yet: the hook finds no adapter and calls SGLang's own op (which has a CUDA kernel only,
    so on this CPU it says so: the call reached it)."""
    out = run(site, """
        import torch
        from sglang.srt.plugins import load_plugins
        load_plugins()
        import sglang.srt.layers.flashinfer_comm_fusion as fusion
        x = torch.randn(4, 64)
        try:
            fusion.flashinfer_allreduce_residual_rmsnorm(x, torch.randn_like(x), torch.ones(64))
        except NotImplementedError as exc:
            print("reached", str(exc).split(" with arguments")[0])
    """, tmp_path)
    assert "reached Could not run 'sglang::flashinfer_allreduce_residual_rmsnorm'" in out


# -- the gates, without an engine ---------------------------------------------------------------------------
def _gated(cls, max_size=1024, world=2, connected=False, any_size=False):
    """An adapter as a served group leaves it, on this CPU (the gate's device), without the communicator."""
    ca = cls.__new__(cls)
    ca.disabled, ca.world_size, ca.max_size, ca.any_size = False, world, max_size, any_size
    ca.fully_connected, ca.device, ca.comm = connected, torch.device("cpu"), None
    return ca


@pytest.mark.parametrize("cls, at_limit", [(VllmCustomAllreduce, False), (SglangCustomAllreduce, True)])
def test_the_size_gate_follows_each_engine(cls, at_limit):
    ca = _gated(cls)
    assert ca.should_custom_ar(torch.empty(512, dtype=torch.bfloat16)) is at_limit  # exactly max_size bytes
    assert ca.should_custom_ar(torch.empty(504, dtype=torch.bfloat16))
    assert not ca.should_custom_ar(torch.empty(520, dtype=torch.bfloat16))
    assert _gated(cls, any_size=True).should_custom_ar(torch.empty(1 << 16, dtype=torch.bfloat16))


@pytest.mark.parametrize("cls", [VllmCustomAllreduce, SglangCustomAllreduce])
def test_the_gate_takes_only_what_the_kernels_take(cls):
    ca = _gated(cls, max_size=1 << 20)
    ok = torch.empty(16, 64, dtype=torch.float16)
    assert ca.should_custom_ar(ok) and ca.should_custom_ar(ok.t())  # weakly contiguous: any dense order
    assert ca.should_custom_ar(torch.empty(8, 8, dtype=torch.float32))
    assert not ca.should_custom_ar(torch.empty(7, dtype=torch.float16))  # 14 bytes: not whole packs
    assert not ca.should_custom_ar(torch.empty(64, dtype=torch.int32))
    assert not ca.should_custom_ar(torch.empty(16, 64, dtype=torch.float16)[:, :32])  # not one dense span
    assert not ca.should_custom_ar(torch.empty(65, dtype=torch.float16)[1:])  # starts off a 16-byte boundary
    assert not _gated(cls, 1 << 20, world=4).should_custom_ar(ok)  # 4 GPUs, not fully connected
    assert _gated(cls, 1 << 20, world=4, connected=True).should_custom_ar(ok)
    disabled = _gated(cls)
    disabled.disabled = True
    assert not disabled.should_custom_ar(ok) and disabled.custom_all_reduce(ok) is None


@pytest.mark.parametrize("cls", [VllmCustomAllreduce, SglangCustomAllreduce])
def test_the_fused_gate_declines_rows_the_kernels_cannot_take(cls):
    ca = _gated(cls, max_size=4096)
    assert ca.fused_allreduce_rmsnorm(torch.empty(4, 12, dtype=torch.bfloat16), None, None, 1e-6) is None  # 24-byte rows
    assert ca.fused_allreduce_rmsnorm(torch.empty(64, 64, dtype=torch.bfloat16), None, None, 1e-6) is None  # 8 KiB > 4 KiB
    assert ca._rows_per_call(torch.empty(16, 64, dtype=torch.bfloat16)) == 16
    assert _gated(cls, max_size=4096, any_size=True)._rows_per_call(torch.empty(64, 64, dtype=torch.bfloat16)) == 32
    assert ca.fused_allreduce_rmsnorm_fp8(torch.empty(64, 64, dtype=torch.bfloat16), None, None, 1e-6) is None


def test_readme_names_the_pinned_versions():
    """The versions live in fused_ar/integrations/__init__.py; README says the same."""
    readme = (REPO / "README.md").read_text()
    assert f"Tested with vLLM {ENGINE_VERSIONS['vllm']}" in readme
    assert f"Tested with SGLang {ENGINE_VERSIONS['sglang']}" in readme
