"""The AMD side on a CPU machine: the CDNA lane maps (csrc/flash/arch/cdna_layout.h) compiled with g++
against hip/AMD.md's layouts, the hipify step (hip/hipify_sources.py) and the ISA checker
(hip/check_isa.py). Compiling the probe kernel, the forward, the backward and the split-KV decode for
gfx90a / gfx942 is CI's hip/ci_check.sh."""

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLASH = os.path.join(ROOT, "csrc", "flash")


def _load_hip_script(name):
    """hip/<name>.py by path: putting the repository root on sys.path would make every later test
    import flash_attn from the source tree rather than from the install."""
    spec = importlib.util.spec_from_file_location(f"hip_{name}", os.path.join(ROOT, "hip", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_isa = _load_hip_script("check_isa")
hipify_sources = _load_hip_script("hipify_sources")


def test_cdna_lane_maps_match_amd_layouts(tmp_path):
    """tests/hip/cdna_layout_test.cpp: every lane and register of the 32x32x8 and 16x16x16 maps against
    AMD.md's formulas; each A, B and D element owned once; operands 4 consecutive k; S^T accumulator
    group t = B operand of step t; column lanes = the xor-shuffle group."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found: the CDNA lane maps are checked by a host C++ test")
    binary = tmp_path / "cdna_layout_test"
    subprocess.run([compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tests", "hip", "cdna_layout_test.cpp"), "-o", str(binary)], check=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0 and "ALL OK" in result.stdout, result.stdout + result.stderr


def _digest_tree(folder):
    digest = hashlib.sha256()
    for path in sorted(os.path.join(d, n) for d, _, names in os.walk(folder) for n in names):
        digest.update(path.encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def hipified(tmp_path_factory):
    """csrc/flash hipified into a temporary build tree (torch's bundled hipify); csrc left as it was."""
    pytest.importorskip("torch.utils.hipify.hipify_python")
    before = _digest_tree(FLASH)
    out = tmp_path_factory.mktemp("hip")
    written = hipify_sources.hipify_tree(str(out))
    assert _digest_tree(FLASH) == before, "hipify modified csrc/flash"
    return str(out), written


def _tree_files(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names)


def test_hipify_writes_every_source_under_its_name(hipified):
    out, written = hipified
    expected = sorted(os.path.join("flash", hipify_sources._output_name(p)) for p in _tree_files(FLASH)
                      if p.endswith(hipify_sources.SOURCE_EXTENSIONS))
    assert sorted(written) == expected
    assert _tree_files(out) == expected, "the staging folder was not removed"


def test_hipified_includes_resolve_to_tree_files(hipified):
    """Every quoted include names a file of the tree by its original name (none of hipify's `_hip` copies)."""
    out, written = hipified
    for path in written:
        with open(os.path.join(out, path), encoding="utf-8") as f:
            for include in re.findall(r'#\s*include\s*"([^"]+)"', f.read()):
                if include.startswith("hip/"):
                    continue  # a ROCm header that hipify inserted
                assert os.path.exists(os.path.join(out, os.path.dirname(path), include)), f"{path}: {include}"


def test_hipify_converts_launches_and_runtime(hipified):
    out, written = hipified
    texts = {}
    for path in written:
        with open(os.path.join(out, path), encoding="utf-8") as f:
            texts[path] = f.read()
    assert not [p for p, t in texts.items() if "<<<" in t], "a kernel launch was left as <<<...>>>"
    assert not [p for p, t in texts.items() if "cuda_runtime.h" in t]
    launcher = texts[os.path.join("flash", "fwd_query_block.cuh")]
    assert "#include <hip/hip_runtime.h>" in launcher and "hipLaunchKernelGGL" in launcher
    attributes = texts[os.path.join("flash", "launch_attributes.h")]
    assert "hipFuncSetAttribute" in attributes and "hipDeviceGetAttribute" in attributes
    assert "cudaDevAttr" not in attributes
    assert os.path.join("flash", "dropout_mask.hip") in texts


def test_untranslated_spellings_only_in_nvidia_arch_files(hipified):
    """What hipify leaves (inline PTX, *_sync, __CUDA_ARCH__, 32-lane masks, ...) lies in arch/sm80* and
    arch/sm90*, which the HIP build never includes, plus exactly the documented KNOWN_LEFTOVERS."""
    out, _ = hipified
    leftovers = hipify_sources.untranslated(os.path.join(out, "flash"))
    assert hipify_sources.unexpected_leftovers(leftovers) == {}
    outside_arch = {path: {spelling for _, spelling, _ in hits} for path, hits in leftovers.items()
                    if not hipify_sources.is_nvidia_arch_file(os.path.join("flash", path))}
    assert outside_arch == hipify_sources.KNOWN_LEFTOVERS, "update KNOWN_LEFTOVERS: a leftover was fixed or added"
    assert os.path.join("arch", "sm80.cuh") in leftovers  # the scan does find PTX where it is


def test_cdna_arch_files_spell_no_cuda():
    """The CDNA layer needs nothing from hipify: no CUDA-only spelling in arch/cdna*."""
    leftovers = hipify_sources.untranslated(os.path.join(FLASH, "arch"))
    assert not [path for path in leftovers if os.path.basename(path).startswith("cdna")], leftovers


def test_hipify_refuses_to_write_inside_csrc():
    with pytest.raises(ValueError):
        hipify_sources.hipify_tree(os.path.join(FLASH, "hip_out"))


@pytest.mark.parametrize("target,kernel,mnemonic", [
    ("gfx90a", "probe_attention_fp16_32x32x8", "v_mfma_f32_32x32x8f16"),
    ("gfx90a", "probe_attention_bf16_32x32x8", "v_mfma_f32_32x32x8bf16_1k"),
    ("gfx90a", "probe_attention_fp16_16x16x16", "v_mfma_f32_16x16x16f16"),
    ("gfx90a", "probe_attention_bf16_16x16x16", "v_mfma_f32_16x16x16bf16_1k"),
    ("gfx942", "probe_attention_fp16_32x32x8", "v_mfma_f32_32x32x8_f16"),
    ("gfx942", "probe_attention_bf16_32x32x8", "v_mfma_f32_32x32x8_bf16"),
    ("gfx942", "probe_attention_fp16_16x16x16", "v_mfma_f32_16x16x16_f16"),
    ("gfx942", "probe_attention_bf16_16x16x16", "v_mfma_f32_16x16x16_bf16"),
])
def test_isa_check_expects_the_targets_mfma_spelling(target, kernel, mnemonic):
    assert check_isa.expected_mfma(kernel, target) == mnemonic


# Remarks as clang 15 (hipcc 5.2) and clang 19 print them.
_REMARKS = """\
remark: /src/probe.hip:185:0: Function Name: probe_attention_fp16_32x32x8 [-Rpass-analysis=kernel-resource-usage]
remark: /src/probe.hip:185:0:     SGPRs: 42 [-Rpass-analysis=kernel-resource-usage]
remark: /src/probe.hip:185:0:     VGPRs: 205 [-Rpass-analysis=kernel-resource-usage]
remark: /src/probe.hip:185:0:     AGPRs: 66 [-Rpass-analysis=kernel-resource-usage]
remark: /src/probe.hip:185:0:     ScratchSize [bytes/lane]: 0 [-Rpass-analysis=kernel-resource-usage]
remark: /src/probe.hip:185:0:     Occupancy [waves/SIMD]: 1 [-Rpass-analysis=kernel-resource-usage]
remark: /src/probe.hip:185:0:     SGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
remark: /src/probe.hip:185:0:     VGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
remark: /src/probe.hip:185:0:     LDS Size [bytes/block]: 34304 [-Rpass-analysis=kernel-resource-usage]
/src/probe.hip:186:1: remark: Function Name: probe_attention_bf16_32x32x8 [-Rpass-analysis=kernel-resource-usage]
/src/probe.hip:186:1: remark:     VGPRs: 300 [-Rpass-analysis=kernel-resource-usage]
/src/probe.hip:186:1: remark:     ScratchSize [bytes/lane]: 20 [-Rpass-analysis=kernel-resource-usage]
/src/probe.hip:186:1: remark:     VGPRs Spill: 4 [-Rpass-analysis=kernel-resource-usage]
/src/probe.hip:186:1: remark:     LDS Size [bytes/block]: 70000 [-Rpass-analysis=kernel-resource-usage]
"""

_ISA = """\
probe_attention_fp16_32x32x8:           ; @probe_attention_fp16_32x32x8
\tds_read_b64 v[0:1], v2 offset:16
\tv_mfma_f32_32x32x8f16 a[0:15], v[0:1], v[2:3], a[0:15]
.Lfunc_end0:
probe_attention_bf16_32x32x8:           ; @probe_attention_bf16_32x32x8
\tflat_load_dwordx2 v[0:1], v[2:3]
\tv_mfma_f32_32x32x8bf16_1k a[0:15], v[0:1], v[2:3], a[0:15]
\tv_mfma_f32_32x32x8f16 a[0:15], v[0:1], v[2:3], a[0:15]
.Lfunc_end1:
"""


_FWD_FP16 = "_ZN5flash10fwd_kernelI6__halfNS_9FwdConfigILi64ELi128ELi128ELi4EEELb0EEEvNS_9FwdParamsE"
_FWD_BF16 = "_ZN5flash10fwd_kernelI12hip_bfloat16NS_9FwdConfigILi128ELi128ELi32ELi4EEELb1EEEvNS_9FwdParamsE"


@pytest.mark.parametrize("target,kernel,mnemonic,label", [
    ("gfx90a", _FWD_FP16, "v_mfma_f32_32x32x8f16", "fwd_fp16_hd64_m128n128w4"),
    ("gfx90a", _FWD_BF16, "v_mfma_f32_32x32x8bf16_1k", "fwd_bf16_hd128_m128n32w4_extras"),
    ("gfx942", _FWD_FP16, "v_mfma_f32_32x32x8_f16", "fwd_fp16_hd64_m128n128w4"),
    ("gfx942", _FWD_BF16.replace("12hip_bfloat16", "14__hip_bfloat16"), "v_mfma_f32_32x32x8_bf16",
     "fwd_bf16_hd128_m128n32w4_extras"),
])
def test_isa_check_knows_the_forward_kernels(target, kernel, mnemonic, label):
    """fwd_kernel<T, FwdConfig<...>, extras> as clang mangles it (ROCm 5.2's and newer bf16 spellings):
    the 32x32x8 atom of arch/cdna_gemm.cuh, a readable label and the tile; other functions are skipped."""
    assert check_isa.expected_mfma(kernel, target) == mnemonic
    spec = check_isa.kernel_spec(kernel)
    assert spec["label"] == label and spec["tile"] == tuple(int(x) for x in re.findall(r"Li(\d+)E", kernel))
    assert check_isa.kernel_spec("_ZN5flash4arch3fooEv") is None


def test_isa_check_adds_the_forwards_dynamic_lds():
    """The forward's LDS is dynamic: the fwd_lds_* constants of its tiles in the ISA count, with the
    LDS-limited occupancy (whole workgroups of 64 KiB per CU over 4 SIMDs); a tile without one fails."""
    isa = "fwd_lds_64_128_128_4:\n\t.long\t54272                           ; 0xd400\n\t.size\tfwd_lds_64_128_128_4, 4\n"
    dynamic = check_isa.dynamic_lds(isa)
    assert dynamic == {"fwd_lds_64_128_128_4": 54272}
    assert check_isa.lds_bytes(_FWD_FP16, {"lds": 0}, dynamic) == 54272
    assert check_isa.lds_bytes(_FWD_BF16, {"lds": 0}, dynamic) is None
    assert check_isa.lds_occupancy(_FWD_FP16, 54272) == 1
    assert check_isa.lds_occupancy("probe_attention_fp16_32x32x8", 16384) == 4
    resources = dict(scratch=0, sgpr_spill=0, vgpr_spill=0, lds=0)
    body = ["ds_read_b64", "v_mfma_f32_32x32x8f16"]
    assert check_isa.check_kernel(_FWD_FP16, "gfx90a", body, resources, 54272) == []
    assert "LDS 70000" in " ".join(check_isa.check_kernel(_FWD_FP16, "gfx90a", body, resources, 70000))


_BWD_FP16 = "_ZN5flash10bwd_kernelI6__halfNS_9BwdConfigILi64ELi64ELi64ELi4ELi2ELi2ELi2EEELb0EEEvNS_9BwdParamsEi"
_BWD_BF16 = "_ZN5flash10bwd_kernelI14__hip_bfloat16NS_9BwdConfigILi32ELi64ELi64ELi2ELi2ELi2ELi2EEELb1EEEvNS_9BwdParamsEi"
_BWD_VP = "_ZN5flash10bwd_kernelI6__halfNS_22BwdConfigVPInRegistersILi128ELi64ELi64ELi2ELi2EEELb0EEEvNS_9BwdParamsEi"
_BWD_EXTRAS_M32 = "_ZN5flash10bwd_kernelI6__halfNS_9BwdConfigILi96ELi32ELi32ELi1ELi1ELi1ELi1EEELb1EEEvNS_9BwdParamsEi"
_BWD_SPLIT = "_ZN5flash10bwd_kernelI6__halfNS_17BwdConfigDimSplitILi192ELi32ELi32ELi2ELi2ELb0EEELb0EEEvNS_9BwdParamsEi"
_BWD_SPLIT_V = ("_ZN5flash10bwd_kernelI14__hip_bfloat16NS_17BwdConfigDimSplitILi256ELi32ELi32ELi2ELi2ELb1EEELb1EEEvNS_"
                "9BwdParamsEi")
_PREPROCESS = "_ZN5flash21bwd_preprocess_kernelI6__halfLi64EEEvNS_9BwdParamsE"
_CONVERT_DQ = "_ZN5flash17convert_dq_kernelI12hip_bfloat16Li32EEEvNS_9BwdParamsE"


@pytest.mark.parametrize("target,kernel,mnemonic,label,waves", [
    ("gfx90a", _BWD_FP16, "v_mfma_f32_32x32x8f16", "bwd_fp16_hd64_m64n64w4", 4),
    ("gfx942", _BWD_BF16, "v_mfma_f32_32x32x8_bf16", "bwd_bf16_hd32_m64n64w2_extras", 2),
    ("gfx90a", _BWD_VP, "v_mfma_f32_32x32x8f16", "bwd_fp16_hd128_m64n64w2_vp", 2),
    ("gfx942", _BWD_EXTRAS_M32, "v_mfma_f32_32x32x8_f16", "bwd_fp16_hd96_m32n32w1_extras", 1),
    ("gfx90a", _BWD_SPLIT, "v_mfma_f32_32x32x8f16", "bwd_fp16_hd192_m32n32w2_split", 2),
    ("gfx942", _BWD_SPLIT_V, "v_mfma_f32_32x32x8_bf16", "bwd_bf16_hd256_m32n32w2_split_v_extras", 2),
    ("gfx90a", _PREPROCESS, None, "bwd_preprocess_fp16_hd64", 8),
    ("gfx942", _CONVERT_DQ, None, "convert_dq_bf16_hd32", 4),
])
def test_isa_check_knows_the_backward_kernels(target, kernel, mnemonic, label, waves):
    """bwd_kernel<T, BwdConfig<hd, m, n, waves, 3 warp grids>, BwdConfigVPInRegisters<hd, m, n, waves, dQ grid>
    or BwdConfigDimSplit<hd, m, n, waves, waves per score tile, V in registers>, extras> on the 32x32x8
    atom, its dynamic LDS
    from the bwd_lds_<hd>_<m>_<n>_<waves> constant; the preprocess and dQ convert have no MFMA and no
    dynamic LDS."""
    spec = check_isa.kernel_spec(kernel)
    assert check_isa.expected_mfma(kernel, target) == mnemonic
    assert spec["label"] == label and spec["waves"] == waves
    dynamic = {"bwd_lds_64_64_64_4": 55808, "bwd_lds_32_64_64_2": 39424, "bwd_lds_128_64_64_2": 61952,
               "bwd_lds_96_32_32_1": 31872, "bwd_lds_192_32_32_2": 64768, "bwd_lds_256_32_32_2": 64256}
    expected_lds = {"bwd_fp16_hd64_m64n64w4": 55808, "bwd_bf16_hd32_m64n64w2_extras": 39424,
                    "bwd_fp16_hd128_m64n64w2_vp": 61952, "bwd_fp16_hd96_m32n32w1_extras": 31872,
                    "bwd_fp16_hd192_m32n32w2_split": 64768,
                    "bwd_bf16_hd256_m32n32w2_split_v_extras": 64256}.get(label, 0)
    assert check_isa.lds_bytes(kernel, {"lds": 0}, dynamic) == expected_lds


def test_isa_check_wants_no_mfma_in_the_backward_helpers():
    """The preprocess and the dQ convert pass without MFMA or 8-byte LDS reads, and fail with an MFMA."""
    resources = dict(scratch=0, sgpr_spill=0, vgpr_spill=0, lds=0)
    assert check_isa.check_kernel(_PREPROCESS, "gfx90a", ["global_load_dwordx4"], resources) == []
    failures = check_isa.check_kernel(_CONVERT_DQ, "gfx90a", ["v_mfma_f32_32x32x8f16"], resources)
    assert "unexpected MFMA" in " ".join(failures)
    body = ["ds_read_b64", "v_mfma_f32_32x32x8f16"]
    assert check_isa.check_kernel(_BWD_FP16, "gfx90a", body, resources, 55808) == []
    assert "no 8-byte LDS reads" in " ".join(check_isa.check_kernel(_BWD_FP16, "gfx90a", body[1:], resources))


_SPLITKV = ("_ZN5flash14splitkv_kernelI6__halfNS_13SplitKvConfigILi128ELi32ELi1ELi3ELi1EEENS_15CpAsyncKvLoaderIS1_"
            "S3_Lb0EEEEEvNS_13SplitKvParamsENT1_4MapsE")
_SPLITKV_PAGED = ("_ZN5flash14splitkv_kernelI12hip_bfloat16NS_13SplitKvConfigILi64ELi32ELi1ELi3ELi2EEENS_15CpAsyncKvLo"
                  "aderIS1_S3_Lb1EEEEEvNS_13SplitKvParamsENT1_4MapsE")
# The kBulk-era name (before the loader became the template parameter): no longer ours.
_SPLITKV_OLD_NAME = ("_ZN5flash14splitkv_kernelI6__halfNS_13SplitKvConfigILi128ELi32ELi1ELi3EEELb0ELb0EEEvNS_"
                     "13SplitKvParamsE")
_APPEND = "_ZN5flash21kvcache_append_kernelI6__halfEEvNS_14KvAppendParamsE"
_COMBINE = "_ZN5flash22splitkv_combine_kernelI12hip_bfloat16EEvNS_13SplitKvParamsE"


@pytest.mark.parametrize("target,kernel,mnemonic,label,waves", [
    ("gfx90a", _SPLITKV, "v_mfma_f32_32x32x8f16", "splitkv_fp16_hd128_k32s1w3", 3),
    ("gfx942", _SPLITKV_PAGED, "v_mfma_f32_32x32x8_bf16", "splitkv_bf16_hd64_k32s1w3_paged", 3),
    ("gfx90a", _APPEND, None, "kvcache_append_fp16", 2),
    ("gfx942", _COMBINE, None, "splitkv_combine_bf16", 4),
])
def test_isa_check_knows_the_decode_kernels(target, kernel, mnemonic, label, waves):
    """splitkv_kernel<T, SplitKvConfig<hd, keys per step, stages, waves, workgroups per CU>,
    CpAsyncKvLoader<T, Cfg, paged>> on the 32x32x8 atom,
    its dynamic LDS from the splitkv_lds_<hd>_<keys>_<stages>_<waves> constant; the append and combine
    kernels have no MFMA and no dynamic LDS."""
    spec = check_isa.kernel_spec(kernel)
    assert check_isa.expected_mfma(kernel, target) == mnemonic
    assert spec["label"] == label and spec["waves"] == waves
    isa = "splitkv_lds_128_32_1_3:\n\t.long\t60952                           ; 0xee18\n"
    dynamic = check_isa.dynamic_lds(isa)
    assert dynamic == {"splitkv_lds_128_32_1_3": 60952}
    expected_lds = {"splitkv_fp16_hd128_k32s1w3": 60952}.get(label, None if spec["tile"] else 0)
    assert check_isa.lds_bytes(kernel, {"lds": 0}, dynamic) == expected_lds


def test_isa_check_fails_on_a_flash_kernel_it_cannot_name():
    """A kernel of ours whose mangled name the script does not recognize would go unchecked: it is
    listed as a failure (the split-KV kernels dropped out of the check so once, when their template
    parameters changed); other functions are not ours to name."""
    names = [_SPLITKV, _SPLITKV_OLD_NAME, _COMBINE, "_Z9other_kernelv"]
    assert check_isa.unrecognized_kernels(names) == [_SPLITKV_OLD_NAME]


def test_isa_check_rejects_scratch_and_vgpr_spills_in_every_kernel():
    """Scratch fails on both targets, in the append kernel (whose rotary pieces once sat in scratch under
    gfx90a's LLVM 15) as in the split-KV kernel; a VGPR spill fails too."""
    resources = dict(scratch=64, sgpr_spill=0, vgpr_spill=0, lds=4096)
    for target in ("gfx90a", "gfx942"):
        assert "scratch = 64" in " ".join(check_isa.check_kernel(_APPEND, target, ["global_load_dwordx4"], resources))
    spilled = dict(resources, scratch=0, vgpr_spill=2)
    assert "vgpr_spill = 2" in " ".join(check_isa.check_kernel(_APPEND, "gfx90a", ["global_load_dwordx4"], spilled))
    body = ["ds_read_b64", "v_mfma_f32_32x32x8f16"]
    assert "scratch = 64" in " ".join(check_isa.check_kernel(_SPLITKV, "gfx90a", body, resources, 60952))


def test_isa_check_reports_sgpr_spills_without_failing():
    """SGPR spills with no scratch sit in VGPR lanes: in the table, not a failure (VGPR spills are)."""
    body = ["ds_read_b64", "v_mfma_f32_32x32x8f16"]
    resources = dict(scratch=0, sgpr_spill=56, vgpr_spill=0, lds=34304)
    assert check_isa.check_kernel("probe_attention_fp16_32x32x8", "gfx90a", body, resources) == []
    resources["vgpr_spill"] = 2
    assert check_isa.check_kernel("probe_attention_fp16_32x32x8", "gfx90a", body, resources) != []


def test_isa_check_parses_both_remark_formats_and_flags_failures():
    resources = check_isa.parse_resources(_REMARKS)
    assert resources["probe_attention_fp16_32x32x8"] == dict(sgpr=42, vgpr=205, agpr=66, scratch=0, occupancy=1,
                                                            sgpr_spill=0, vgpr_spill=0, lds=34304)
    bodies = check_isa.kernel_bodies(_ISA)
    good = "probe_attention_fp16_32x32x8"
    assert check_isa.check_kernel(good, "gfx90a", bodies[good], resources[good]) == []
    bad = "probe_attention_bf16_32x32x8"
    failures = " ".join(check_isa.check_kernel(bad, "gfx90a", bodies[bad], resources[bad]))
    for expected in ("unexpected MFMA", "no 8-byte LDS reads", "flat", "scratch = 20", "vgpr_spill = 4",
                     "LDS 70000"):
        assert expected in failures


def test_cdna_layer_compiles_for_gfx90a(tmp_path):
    """Where hipcc is installed (CI installs it after pytest, in hip/ci_check.sh): the arch layer's
    compile-only coverage and the probe build for gfx90a from csrc, and the probe passes the ISA check."""
    hipcc = shutil.which("hipcc")
    if hipcc is None:
        pytest.skip("hipcc not found: hip/ci_check.sh installs it and compiles for gfx90a and gfx942")
    env = dict(os.environ, HIP_PLATFORM="amd")  # hipcc picks nvidia when /usr/local/cuda exists
    flags = ["--offload-arch=gfx90a", "-O3", "-std=c++17", "-I", os.path.join(ROOT, "csrc"),
             "-D__HIP_PLATFORM_AMD__=1", "-D__HIP_NO_HALF_OPERATORS__=1", "-D__HIP_NO_HALF_CONVERSIONS__=1"]
    api_coverage = os.path.join(ROOT, "tests", "hip", "cdna_api_compile.hip")
    subprocess.run([hipcc, *flags, "--cuda-device-only", "-c", api_coverage, "-o", str(tmp_path / "api.o")], check=True,
                   env=env)
    remarks = subprocess.run([hipcc, *flags, "--save-temps", "-Rpass-analysis=kernel-resource-usage", "-c",
                              os.path.join(ROOT, "hip", "probe_attention_block.hip"), "-o", "probe.o"],
                             check=True, env=env, cwd=tmp_path, capture_output=True, text=True).stderr
    (tmp_path / "remarks.txt").write_text(remarks)
    isa = tmp_path / "probe_attention_block-hip-amdgcn-amd-amdhsa-gfx90a.s"
    assert check_isa.main(["--target", "gfx90a", "--isa", str(isa), "--remarks", str(tmp_path / "remarks.txt")]) == 0


def test_rocm_instantiations_include_the_cdna_launchers(tmp_path):
    """generate_instantiations.py --target rocm: the forward, backward and kvcache files include the CDNA
    launchers (which define run_fwd / run_bwd / run_fwd_kvcache for a ROCm build); the CUDA files are as
    before."""
    spec = importlib.util.spec_from_file_location("generate_instantiations",
                                                  os.path.join(ROOT, "csrc", "generate_instantiations.py"))
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    includes = {}
    for target in ("cuda", "rocm"):
        for path in generator.generate(str(tmp_path / target), ("fp16",), (64,), target):
            with open(path, encoding="utf-8") as f:
                includes[target, os.path.basename(path)] = re.search(r'#include "flash/(\w+)\.cuh"', f.read()).group(1)
    assert includes["cuda", "fwd_fp16_hd64.cu"] == "launch_fwd" and includes["cuda", "bwd_fp16_hd64.cu"] == "launch_bwd"
    assert includes["rocm", "fwd_fp16_hd64.cu"] == "launch_fwd_cdna"
    assert includes["rocm", "bwd_fp16_hd64.cu"] == "launch_bwd_cdna"
    assert includes["cuda", "fwd_kvcache_fp16_hd64.cu"] == "launch_kvcache"
    assert includes["rocm", "fwd_kvcache_fp16_hd64.cu"] == "launch_kvcache_cdna"


# ---- README states what is verified on AMD, and CI compiles what it says ----

AMD_STATUS = "compiles for gfx90a and gfx942 with matrix-core instructions; not yet run on AMD hardware"


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_says_exactly_what_is_verified_on_amd():
    """Issue #11: README says exactly AMD_STATUS, where the install is described and in the feature
    table's AMD row, and nowhere claims the kernels ran on an AMD GPU."""
    readme = _readme()
    setup = readme.split("## Set up and run", 1)[1].split("\n## ", 1)[0]
    amd_row = next(line for line in readme.splitlines() if line.startswith("| AMD (HIP"))
    assert AMD_STATUS in setup and AMD_STATUS in amd_row


def _instantiated_head_dims(source, launcher):
    with open(os.path.join(ROOT, "hip", source), encoding="utf-8") as f:
        text = f.read()
    found = {}
    for dtype, headdim in re.findall(rf"flash::{launcher}<(half_t|bfloat16_t), (\d+)>", text):
        found.setdefault(dtype, set()).add(int(headdim))
    return found


@pytest.mark.parametrize("source, launcher", [
    ("fwd_kernels_cdna.hip", "run_fwd_cdna"),
    ("bwd_kernels_cdna.hip", "run_bwd_cdna"),
    ("kvcache_kernels_cdna.hip", "run_fwd_kvcache_cdna"),
])
def test_ci_compiles_every_head_dim_for_cdna(source, launcher):
    """What hip/ci_check.sh compiles (and README claims: head dims 32 to 256 for the forward, the
    backward and the decode, fp16 and bf16) is every head dim a build instantiates."""
    spec = importlib.util.spec_from_file_location("generate_instantiations",
                                                  os.path.join(ROOT, "csrc", "generate_instantiations.py"))
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    every = set(generator.ALL_HEADDIMS)
    assert min(every) == 32 and max(every) == 256  # README's "head dims 32 to 256"
    assert _instantiated_head_dims(source, launcher) == {"half_t": every, "bfloat16_t": every}
