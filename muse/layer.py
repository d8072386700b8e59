"""A prepared layer: the weights in the layouts its plans read, the split-K buffers, one planned launch per m, and
describe(). prepare() (muse/api.py) builds it; kernel_fn launches it."""
import os

import torch

from .families import (FAMILIES, MAX_M, GemvConfig, GemvtConfig, config_misfit, family_of, family_path, instance_label,
                       kernel_name, runtime_values, template_args)
from .packing import pack_plain, pack_tma, split_hi_lo, unpack_plain, unpack_tma
from .planner import PlanEntry
from .zformat import decode_rows, exception_entries, side_table_bits


def pdl_default():
    """PDL for a new layer: on unless MUSE_PDL=0."""
    return os.environ.get("MUSE_PDL", "1") != "0"


class Layer:
    """A prepared layer: packed weights, workspace, and the plan for every m (see describe())."""

    def __init__(self, name, weight):
        self.name = name
        self.weight = weight                       # the caller's tensor, until prepare(one_copy=True) drops it
        self.dtype = weight.dtype
        self.N, self.K = weight.shape
        self.dual = weight.dtype == torch.float32
        self.out_dtype = torch.float32 if self.dual else torch.bfloat16
        self.device = weight.device
        self.pdl = pdl_default()
        self._launches = {}                        # m -> the glue's Launch, built on first use (see launch())
        self._ext = None                           # the built extension the launches use (prepare's ext=)
        self.plans = []                            # plans[m] for m = 1..MAX_M (index 0 unused)
        self.w = self.w2 = None                    # gemv: packed hi (and lo)
        self.z = None                              # gemvz: ZPack
        self.z_note = "not tried"
        self.wt = None                             # gemvt: pack_tma's tiles
        self.ws = self.sem = None

    # -- sizes ---------------------------------------------------------------------------------------------------
    def bytes_read(self, m):
        """Weight bytes one call at this m streams from memory (what the kernel really reads)."""
        p = self.plan(m)
        if p.path == "compressed":
            return self.z.stream.numel() + 8 * self.z.n_exc + 4 * (self.N + 1)
        if p.path == "plain":
            return 2 * self.N * self.K * (2 if self.dual else 1)
        if self.weight is None:                  # the m > 32 path rebuilds slices from the layer's own copy
            return sum(t.numel() * t.element_size() for t in self._copies().values())
        return self.weight.numel() * self.weight.element_size()

    def _copies(self):
        """{what: tensor} of the weight bytes this layer holds (the packed copies, and the caller's tensor while it is
        referenced); the split-K workspace is not a copy of the weights."""
        out = {}
        if self.weight is not None:
            out["the caller's tensor"] = self.weight
        if self.z is not None:
            out.update({"12-bit stream": self.z.stream, "windows": self.z.zbase, "side table": self.z.esc,
                        "row offsets": self.z.eptr})
        if self.w is not None:
            out["fragment-order copy"] = self.w
        if self.w2 is not None and self.w2 is not self.w:
            out["fragment-order lo half"] = self.w2
        if self.wt is not None:
            out["TMA tiles"] = self.wt
        return out

    def bytes_held(self):
        """GPU bytes this layer keeps alive: the storages of its weight copies (and of the caller's tensor while it is
        referenced: the whole storage, a view's too) and of the split-K workspace, each counted once."""
        tensors = list(self._copies().values()) + [t for t in (self.ws, self.sem) if t is not None]
        return sum({(t.device, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes() for t in tensors}.values())

    def exception_columns(self):
        """Columns k that hold at least one out-of-window weight (probe these: a lossy format fails)."""
        return list(self.z.exc_cols) if self.z is not None else []

    def plan(self, m):
        return self.plans[m] if 1 <= m <= MAX_M else PlanEntry("fallback", None, f"m={m} > {MAX_M}")

    # -- launches ------------------------------------------------------------------------------------------------
    @property
    def ext(self):
        """The built extension this layer launches with: the shipped build unless prepare(ext=) or an assignment
        chose a variant (tools, tests)."""
        return self._ext

    @ext.setter
    def ext(self, mod):
        self._ext = mod
        self._launches = {}

    @property
    def ws(self):
        """The split-K workspace (float4 partials, cl = 0); a new one (tools: trace_chain's larger one) rebuilds the
        launches that point at it."""
        return self._ws

    @ws.setter
    def ws(self, t):
        self._ws = t
        self._launches = {}

    def _weights(self, fam):
        """The pointers of the packed weights a family reads: w, w2 (gemv's lo half; w itself for bf16), and gemvz's
        windows and side table."""
        ptr = lambda t: 0 if t is None else t.data_ptr()   # noqa: E731
        if fam.weights == "plain":
            return dict(w=ptr(self.w), w2=ptr(self.w2), eptr=0, esc=0, zbase=0)
        if fam.weights == "z":
            z = self.z
            return dict(w=ptr(z.stream), w2=0, eptr=ptr(z.eptr), esc=ptr(z.esc), zbase=ptr(z.zbase))
        return dict(w=ptr(self.wt), w2=0, eptr=0, esc=0, zbase=0)

    def launch(self, m):
        """The glue's Launch of a CUDA plan at m: its kernel (family and template arguments), the layer's weights and
        split-K buffers, the config's runtime fields; a call then passes only x, out, m and the stream. prepare builds
        every plan's; set_config, a new workspace or another extension drop them, and the next call rebuilds."""
        lr = self._launches.get(m)
        if lr is None:
            c = self.plans[m].config
            fam, t = family_of(c), template_args(c, m, self.dual)
            lr = self._ext.Launch(family=FAMILIES.index(fam), t=[int(v) for v in t], what=instance_label(fam.name, t),
                                  ws=0 if self.ws is None else self.ws.data_ptr(),
                                  sem=0 if self.sem is None else self.sem.data_ptr(), N=self.N, K=self.K,
                                  rt=runtime_values(c), **self._weights(fam))
            self._launches[m] = lr
        return lr

    # -- the m > 32 path from the layer's own bytes ------------------------------------------------------------------
    def can_drop_weight(self):
        """Whether every m can run from the layer's own copies, so it need not reference the caller's tensor: the
        kernels take every m <= 32 (no shape fallback), and dense() can rebuild the weight for m > 32 from the 12-bit
        stream, the fragment-order copy or (N % 64 == 0) the TMA tiles."""
        if any(p.path == "fallback" for p in self.plans[1:]):
            return False
        return self.z is not None or self.w is not None or (self.wt is not None and self.N % 64 == 0)

    def dense(self, r0, r1):
        """Rows r0 .. r1 - 1 of W, [r1 - r0, K], bf16 (fp32 for the router's hi + lo), from the caller's tensor while it
        is referenced, else from the layer's own copy: the 12-bit stream decoded by the kernels' own decz
        (unpackz_kernel on the slice's row blocks) with the slice's out-of-window weights written back as fl(v + c),
        which prepare verified is W; or the fragment-order copy or TMA tiles, permuted back. r0 and r1: multiples of
        16 (of 64 from the tiles)."""
        if self.weight is not None:
            return self.weight[r0:r1]
        if self.z is not None:
            out = self._decode_rows(r0, r1)
            r, k, c = exception_entries(self.z, r0, r1)
            out[r, k] = (out[r, k].float() + c).to(torch.bfloat16)
            return out
        if self.w is not None:
            hi = unpack_plain(self.w, r0 // 16, r1 // 16)
            return hi.float() + unpack_plain(self.w2, r0 // 16, r1 // 16).float() if self.dual else hi
        if self.wt is not None:
            return unpack_tma(self.wt, r0 // 64, r1 // 64)
        raise RuntimeError(f"layer '{self.name}' holds no copy of its weight")

    def _decode_rows(self, r0, r1):
        """decode_rows with this layer's build (the CPU tests put lab 3's decoder here)."""
        return decode_rows(self.z, r0, r1, self._ext)

    def set_config(self, m, cfg):
        """Use cfg (a config of any family: GemvConfig, GemvzConfig, GemvtConfig, GemvtzConfig) for m from now on
        (tune.py, tools); packs the weights its family reads and grows the workspace if needed."""
        why = config_misfit(cfg, self.N, self.K, m, self.dual)
        if why:
            raise ValueError(f"config {cfg} does not fit layer '{self.name}' at m={m}: {why}")
        path = family_path(family_of(cfg))
        if path == "compressed" and self.z is None:
            raise ValueError(f"layer '{self.name}' has no compressed weights ({self.z_note})")
        self.plans[m] = PlanEntry(path, cfg, "set_config")
        self.pack()
        self._alloc_workspace()
        self._launches = {}

    # -- internals -----------------------------------------------------------------------------------------------
    def pack(self):
        """The packed weights every plan's family reads (gemv: fragment order; gemvt: swizzled tiles), once each.
        gemvz's stream is prepare's (it is verified on the GPU there). A layer that dropped the caller's tensor
        (prepare(one_copy=True)) cannot pack another layout."""
        cfgs = [p.config for p in self.plans[1:] if p is not None]
        if self.weight is None and ((self.w is None and any(isinstance(c, GemvConfig) for c in cfgs)) or
                                    (self.wt is None and any(isinstance(c, GemvtConfig) for c in cfgs))):
            raise ValueError(f"layer '{self.name}' holds one copy (prepare(one_copy=True)): it has no bf16 weight to "
                             f"pack another layout from; prepare it with one_copy=False for plain configs")
        if self.w is None and any(isinstance(c, GemvConfig) for c in cfgs):
            if self.dual:
                hi, lo = split_hi_lo(self.weight)
                self.w, self.w2 = pack_plain(hi), pack_plain(lo)
            else:
                self.w = pack_plain(self.weight)
                self.w2 = self.w
        if self.wt is None and any(isinstance(c, GemvtConfig) for c in cfgs):
            self.wt = pack_tma(self.weight)

    def _alloc_workspace(self):
        """The ticket path's split-K buffers, sized for the largest plan: ws (float4 partials, scratch) and sem (one
        ticket a row group, zero between calls: every call leaves it so)."""
        need = 1
        for p in self.plans[1:]:
            if p.path in ("plain", "compressed") and p.config.s > 1 and not p.config.cl:
                need = max(need, self.N // 16 * p.config.s * 4 * 32)
        if self.ws is None or self.ws.shape[0] < need:
            self.ws = torch.empty((need, 4), dtype=torch.float32, device=self.device)
        if self.sem is None:
            self.sem = torch.zeros(max(self.N // 16, 1), dtype=torch.int32, device=self.device)

    def describe(self):
        mb = self.N * self.K * (4 if self.dual else 2) / 1e6
        head = (f"layer '{self.name}' [{self.N} x {self.K}] {str(self.dtype).replace('torch.', '')}"
                f" ({mb:.1f} MB){' DUAL hi+lo -> fp32 out' if self.dual else ''}; PDL {'on' if self.pdl else 'off'}")
        lines = [head]
        held = self.bytes_held()
        drop = "" if self.weight is None else "; prepare(one_copy=True) drops the tensor and any second copy"
        lines.append(f"  holds {held / 1e6:.1f} MB ({held / (self.N * self.K):.2f} bytes a weight, split-K workspace "
                     f"included): {', '.join(self._copies())}{drop}")
        if self.z is not None:
            z = self.z
            rate = z.n_exc / (self.N * self.K)
            lo, hi = int(z.zbase.min()), int(z.zbase.max())
            lines.append(f"  12-bit format: row windows start at class {lo}..{hi}"
                         f"{f' ({z.moved} rows off their fullest run, for exactness)' if z.moved else ''}, "
                         f"{z.n_exc} exceptions ({100 * rate:.4f}%), at most {z.capr} in a row, windows + side table "
                         f"{side_table_bits(z, self.N, self.K):.4f} bit/weight; decode check on the GPU passed")
        else:
            lines.append(f"  12-bit format: {self.z_note}")
        ms = list(range(1, MAX_M + 1))
        i = 0
        while i < len(ms):
            j = i
            while j + 1 < len(ms) and self.plans[ms[j + 1]] == self.plans[ms[i]]:
                j += 1
            p = self.plans[ms[i]]
            rng = f"m={ms[i]}" if i == j else f"m={ms[i]}..{ms[j]}"
            cfg = "" if p.config is None else f" {kernel_name(p.config)} {p.config}"
            lines.append(f"  {rng:<9} {p.path}{cfg}  [{p.why}]")
            i = j + 1
        src = "the caller's tensor" if self.weight is not None else "slices rebuilt from the layer's own copy"
        gemm = "fp32 GEMM" if self.dual else "bf16 GEMM, fp32 split-K sums"
        lines.append(f"  m>{MAX_M}      fallback cuBLAS ({gemm} on {src}: fallback_matmul)  [m > {MAX_M}]")
        return "\n".join(lines)

    __repr__ = describe
