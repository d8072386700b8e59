"""A prepared layer: the weights in the layouts its plans read, the split-K buffers, one planned launch per m, and
describe(). prepare() (muse/api.py) builds it; kernel_fn launches it."""
import os

import torch

from .families import (FAMILIES, MAX_M, GemvConfig, GemvtConfig, config_misfit, family_of, family_path, instance_label,
                       kernel_name, runtime_values, template_args)
from .packing import pack_plain, pack_tma, split_hi_lo
from .planner import PlanEntry
from .zformat import side_table_bits


def pdl_default():
    """PDL for a new layer: on unless MUSE_PDL=0."""
    return os.environ.get("MUSE_PDL", "1") != "0"


class Layer:
    """A prepared layer: packed weights, workspace, and the plan for every m (see describe())."""

    def __init__(self, name, weight):
        self.name = name
        self.weight = weight                       # the caller's tensor: fallback path and reference
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
        return self.weight.numel() * self.weight.element_size()

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
        gemvz's stream is prepare's (it is verified on the GPU there)."""
        cfgs = [p.config for p in self.plans[1:] if p is not None]
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
        mb = self.weight.numel() * self.weight.element_size() / 1e6
        head = (f"layer '{self.name}' [{self.N} x {self.K}] {str(self.weight.dtype).replace('torch.', '')}"
                f" ({mb:.1f} MB){' DUAL hi+lo -> fp32 out' if self.dual else ''}; PDL {'on' if self.pdl else 'off'}")
        lines = [head]
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
        lines.append(f"  m>{MAX_M}      fallback cuBLAS ({'fp32 GEMM' if self.dual else 'bf16 GEMM, fp32 split-K sums'}: "
                     f"fallback_matmul)  [m > {MAX_M}]")
        return "\n".join(lines)

    __repr__ = describe
