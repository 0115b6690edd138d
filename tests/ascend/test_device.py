

def test_the_engine_dtype_is_bf16_only_where_bf16_is_native(monkeypatch):
    import ascend.device as device

    assert device.Platform("cuda", 1).engine_dtype == "bfloat16" and device.Platform("npu", 1).engine_dtype == "bfloat16"
    for flags, expected in (({"avx2", "fma"}, "float32"), ({"avx512f", "avx512_bf16"}, "bfloat16"),
                            ({"amx_bf16"}, "bfloat16"), ({"asimd", "bf16"}, "bfloat16"), (set(), "float32")):  # fmt: skip
        monkeypatch.setattr(device, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert device.Platform("cpu").engine_dtype == expected, flags


def test_cpu_flags_reads_this_machines_cpu():
    import platform

    from ascend.device import cpu_flags

    flags = cpu_flags()
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        assert {"sse2", "fpu"} <= flags
