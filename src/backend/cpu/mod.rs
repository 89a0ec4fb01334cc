//! CPU kernels for sorted-set intersection over plain slices.
//!
//! Every kernel takes two **strictly increasing** slices (sorted ascending in `T`'s own
//! order, no duplicates) and appends their common values, ascending, to `out`.
//! The SQL layer checks sortedness per row (see [`sortedness`]) and never calls a kernel
//! on input that breaks the precondition.
//!
//! Kernels (see [`Kernel`]): a branch-free scalar merge, galloping (exponential search) for
//! skewed lengths, SSE4.2 STTNI (Schlegel et al.), AVX2, AVX-512 and AVX-512 VP2INTERSECT.
//! Each SIMD kernel has the scalar merge as its test oracle. [`intersect_auto`] is the hybrid
//! that picks a kernel per call from the two lengths and the CPU's features.
//!
//! Layout: this file owns the public interface, feature detection, dispatch and the hybrid
//! policy; `scalar`, `gallop`, `avx2`, `avx512` (with VP2INTERSECT), `sse42`, `kway` and
//! `sorted` hold one concern each.
//!
//! Internally every kernel (except the SSE4.2 one, which appends to a `Vec` itself) has the
//! form `unsafe fn k<T, const WRITE: bool>(a, b, dst: *mut T) -> usize`: it returns the
//! number of common values and, when `WRITE`, stores them at `dst`. SIMD kernels may store
//! whole vectors past the last match, so `dst` must be valid for
//! `min(a.len(), b.len()) + slack::<T>()` elements; the public functions reserve that much
//! spare capacity in `out` first and `set_len` afterwards. No kernel reads past a slice end.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::OnceLock;

mod avx2;
mod avx512;
mod bounded;
mod gallop;
mod kway;
mod scalar;
mod sorted;
mod sse42;

pub use bounded::{BoundedKernel, overlap_at_least};
pub(crate) use gallop::prefetch;
pub use kway::{intersect_kway, intersect_kway_count};
pub use sorted::{Sortedness, sortedness};

mod sealed {
    /// Restricts [`super::SetElem`] to the eight primitive integer types, so kernels may
    /// reinterpret `&[T]` as unsigned lanes of `T::BITS` bits.
    pub trait Sealed {}
}

/// An integer element type the kernels work on: all eight Arrow integer widths.
///
/// `BITS` and `SIGNED` let a kernel reinterpret a slice as unsigned lanes of the same width
/// (equality does not care about sign) while doing every *order* decision in `T`'s own order
/// (for signed types: on the bit pattern with the sign bit flipped).
///
/// The trait is sealed: it is implemented for exactly `i8`..`i64` and `u8`..`u64`, which is
/// what makes those reinterpretations sound.
pub trait SetElem:
    sealed::Sealed + Copy + Ord + Hash + Debug + Default + Send + Sync + 'static
{
    /// Width in bits: 8, 16, 32 or 64.
    const BITS: u32;
    /// Whether the type is signed (two's complement).
    const SIGNED: bool;
    /// The value's bits, zero-extended, with the sign bit flipped for signed types: unsigned
    /// comparison of `order_bits` agrees with `T`'s own order.
    fn order_bits(self) -> u64;
}

macro_rules! set_elem {
    ($($t:ty => $u:ty, $bits:expr, $signed:expr);* $(;)?) => {
        $(
        impl sealed::Sealed for $t {}
        impl SetElem for $t {
            const BITS: u32 = $bits;
            const SIGNED: bool = $signed;
            #[inline(always)]
            fn order_bits(self) -> u64 {
                let flip: $u = if $signed { 1 << ($bits - 1) } else { 0 };
                ((self as $u) ^ flip) as u64
            }
        }
        )*
    };
}

set_elem! {
    i8 => u8, 8, true; i16 => u16, 16, true; i32 => u32, 32, true; i64 => u64, 64, true;
    u8 => u8, 8, false; u16 => u16, 16, false; u32 => u32, 32, false; u64 => u64, 64, false;
}

/// How far ahead (bytes) the block kernels prefetch each input stream. Measured on W1/W2
/// (u32, AVX-512 kernel, CPU time, min of 5, ms): no prefetch 82.8/72.3, 1 KiB 64.7/48.8,
/// 4 KiB 61.7/42.6, 8 KiB 59.1/43.8. The data streams from DRAM and the hardware
/// prefetcher alone does not keep up with two interleaved, unevenly advancing streams.
pub(crate) const PREFETCH_BYTES: usize = 4096;

/// Elements of spare capacity a kernel may write past the last match: one 512-bit vector.
#[inline(always)]
pub(crate) const fn slack<T>() -> usize {
    64 / size_of::<T>()
}

/// An intersection kernel. Not every kernel runs on every CPU ([`Kernel::is_available`]) or
/// has a real implementation for every width ([`Kernel::supports_width`]); [`intersect`]
/// falls back to a correct one in either case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Branch-free scalar merge.
    Scalar,
    /// Search of the shorter list's values in the longer one: batches of values searched in
    /// lockstep (branch-free binary searches, prefetched); a single value by exponential +
    /// binary search finished by one SIMD compare.
    Galloping,
    /// SSE4.2 STTNI (`pcmpestrm`) kernel, 16- and 32-bit.
    Sse42,
    /// AVX2 all-pairs block compare: 8x8 (32-bit), 4x4 (64-bit).
    Avx2,
    /// AVX-512 all-pairs block compare: 16x16 (32-bit), 8x8 (64-bit); with AVX-512BW and
    /// VBMI2 also 32x32 (16-bit) and 64x64 (8-bit).
    Avx512,
    /// AVX-512 VP2INTERSECT (`vp2intersectd`/`vp2intersectq`), 32- and 64-bit.
    Vp2intersect,
}

/// Which CPU intersection kernel runs on sorted rows: `Auto` (the measured hybrid) or one
/// kernel forced for every row (the `tuning` feature's `tuning.cpu_kernel`, for testing and
/// benchmarking each kernel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CpuKernelChoice {
    /// Pick per row from the two lengths and the CPU's features.
    #[default]
    Auto,
    /// Force this kernel (falls back to a correct one if the CPU lacks it).
    Fixed(Kernel),
}

impl Kernel {
    /// Every kernel, simplest first.
    pub const ALL: [Kernel; 6] = [
        Kernel::Scalar,
        Kernel::Galloping,
        Kernel::Sse42,
        Kernel::Avx2,
        Kernel::Avx512,
        Kernel::Vp2intersect,
    ];

    /// The kernel's name as the SQL layer spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Galloping => "galloping",
            Kernel::Sse42 => "sse42",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
            Kernel::Vp2intersect => "vp2intersect",
        }
    }

    /// Whether this CPU can run the kernel (run-time detection, cached). Always true for
    /// scalar and galloping; false for the SIMD kernels off x86_64.
    pub fn is_available(self) -> bool {
        let f = features();
        match self {
            Kernel::Scalar | Kernel::Galloping => true,
            Kernel::Sse42 => f.sse42,
            Kernel::Avx2 => f.avx2,
            Kernel::Avx512 => f.avx512f,
            Kernel::Vp2intersect => f.vp2intersect,
        }
    }

    /// Whether the kernel has a real implementation for elements of `bits` bits (8, 16, 32
    /// or 64). Other widths fall back (see [`intersect`]).
    pub fn supports_width(self, bits: u32) -> bool {
        match self {
            Kernel::Scalar | Kernel::Galloping | Kernel::Avx512 => matches!(bits, 8 | 16 | 32 | 64),
            Kernel::Sse42 => matches!(bits, 16 | 32),
            Kernel::Avx2 | Kernel::Vp2intersect => matches!(bits, 32 | 64),
        }
    }

    /// Whether the kernel runs for `T` on this CPU: available, implemented for the width and,
    /// for AVX-512 on 8/16-bit lanes, AVX-512BW + VBMI2 present.
    fn usable<T: SetElem>(self) -> bool {
        usable_with(features(), self, T::BITS)
    }
}

/// CPU features the kernels need, detected once.
#[derive(Clone, Copy, Debug)]
struct Features {
    sse42: bool,
    avx2: bool,
    avx512f: bool,
    avx512_bw_vbmi2: bool,
    vp2intersect: bool,
    /// Which measured table of the hybrid policy applies (see [`Profile`]).
    profile: Profile,
    /// The fastest block kernel per width (index `log2(bits) - 3`), from the flags above.
    best_block: [Kernel; 4],
    /// The same for a short list (`small_block_short`): VP2INTERSECT on the Zen 5 profile,
    /// else the AVX2 block where AVX2 runs the width (one full 8-lane block beats a masked
    /// 16-lane one).
    small_block: [Kernel; 4],
}

/// The CPU whose measurements set the hybrid policy's thresholds (`gallop_ratio`,
/// `small_block`). A CPU never measured takes [`Profile::Xeon`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profile {
    /// Intel Xeon (Sapphire/Emerald Rapids class, AVX-512 without VP2INTERSECT), the first
    /// development machine, and every CPU not matched below (Zen 4 ran with it since).
    Xeon,
    /// AMD with VP2INTERSECT (Zen 5: AVX-512 on a full 512-bit data path), the development
    /// machine since 2026-11-26.
    Zen5,
}

fn features() -> &'static Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    FEATURES.get_or_init(detect)
}

fn detect() -> Features {
    #[cfg(target_arch = "x86_64")]
    let mut f = {
        use std::arch::is_x86_feature_detected as has;
        // Every AVX-512 kernel also counts mask bits with POPCNT (all AVX-512 CPUs have it).
        let avx512f = has!("avx512f") && has!("popcnt");
        Features {
            sse42: sse42::sse42_available(),
            avx2: has!("avx2") && has!("popcnt"),
            avx512f,
            avx512_bw_vbmi2: avx512f && has!("avx512bw") && has!("avx512vbmi2"),
            vp2intersect: avx512f && has!("avx512vp2intersect"),
            profile: Profile::Xeon,
            best_block: [Kernel::Scalar; 4],
            small_block: [Kernel::Scalar; 4],
        }
    };
    #[cfg(target_arch = "x86_64")]
    if f.vp2intersect && is_amd() {
        f.profile = Profile::Zen5;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let mut f = Features {
        sse42: false,
        avx2: false,
        avx512f: false,
        avx512_bw_vbmi2: false,
        vp2intersect: false,
        profile: Profile::Xeon,
        best_block: [Kernel::Scalar; 4],
        small_block: [Kernel::Scalar; 4],
    };
    for (w, bits) in [8, 16, 32, 64].into_iter().enumerate() {
        // VP2INTERSECT is never the large-block kernel: on the one CPU measured with it
        // (Zen 5) AVX-512's broadcast compares beat it from 16 values on, at both widths
        // (`sweep/` in benches/README.md), and on Intel's (Tiger Lake) it is microcoded.
        f.best_block[w] = [Kernel::Avx512, Kernel::Avx2, Kernel::Sse42]
            .into_iter()
            .find(|&k| usable_with(&f, k, bits))
            .unwrap_or(Kernel::Scalar);
        f.small_block[w] =
            if f.profile == Profile::Zen5 && usable_with(&f, Kernel::Vp2intersect, bits) {
                Kernel::Vp2intersect
            } else if usable_with(&f, Kernel::Avx2, bits) {
                Kernel::Avx2
            } else {
                f.best_block[w]
            };
    }
    f
}

/// Whether the CPU's vendor string is AMD's.
#[cfg(target_arch = "x86_64")]
fn is_amd() -> bool {
    // CPUID leaf 0 (the vendor string) exists on every x86_64 CPU.
    let r = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    vendor[..4].copy_from_slice(&r.ebx.to_le_bytes());
    vendor[4..8].copy_from_slice(&r.edx.to_le_bytes());
    vendor[8..].copy_from_slice(&r.ecx.to_le_bytes());
    &vendor == b"AuthenticAMD"
}

/// Whether `kernel` runs for `bits`-bit elements given the features `f`.
fn usable_with(f: &Features, kernel: Kernel, bits: u32) -> bool {
    let available = match kernel {
        Kernel::Scalar | Kernel::Galloping => true,
        Kernel::Sse42 => f.sse42,
        Kernel::Avx2 => f.avx2,
        Kernel::Avx512 => f.avx512f && (bits >= 32 || f.avx512_bw_vbmi2),
        Kernel::Vp2intersect => f.vp2intersect,
    };
    available && kernel.supports_width(bits)
}

/// Index of a width in `Features::best_block`.
const fn width_index(bits: u32) -> usize {
    match bits {
        8 => 0,
        16 => 1,
        32 => 2,
        _ => 3,
    }
}

/// The fastest block (merge-like) kernel usable for `T` here.
#[cfg(test)]
fn best_block<T: SetElem>() -> Kernel {
    features().best_block[width_index(T::BITS)]
}

/// `kernel` if usable for `T` here, else the next best usable one in the order
/// VP2INTERSECT, AVX-512, AVX2, SSE4.2, scalar.
fn resolve<T: SetElem>(kernel: Kernel) -> Kernel {
    if kernel.usable::<T>() {
        return kernel;
    }
    const ORDER: [Kernel; 5] = [
        Kernel::Vp2intersect,
        Kernel::Avx512,
        Kernel::Avx2,
        Kernel::Sse42,
        Kernel::Scalar,
    ];
    let start = ORDER.iter().position(|&k| k == kernel).unwrap_or(0);
    ORDER[start..]
        .iter()
        .copied()
        .find(|k| k.usable::<T>())
        .unwrap_or(Kernel::Scalar)
}

/// Run a resolved, non-SSE4.2 kernel.
///
/// # Safety
/// `kernel.usable::<T>()` (or `kernel` is scalar/galloping), `kernel != Sse42`, `a` and `b`
/// strictly increasing; when `WRITE`, `dst` is valid for writes of
/// `min(a.len(), b.len()) + slack::<T>()` elements.
unsafe fn run<T: SetElem, const WRITE: bool>(
    kernel: Kernel,
    a: &[T],
    b: &[T],
    dst: *mut T,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller checked the kernel is usable (its CPU features are
        // present and it has an implementation for T::BITS, which each arm matches on), and
        // promised the input order and the capacity at `dst` that each kernel requires.
        unsafe {
            match (kernel, T::BITS) {
                (Kernel::Galloping, _) => return gallop::gallop_auto::<T, WRITE>(a, b, dst),
                (Kernel::Avx2, 32) => return avx2::block32::<T, WRITE>(a, b, dst),
                (Kernel::Avx2, 64) => return avx2::block64::<T, WRITE>(a, b, dst),
                (Kernel::Avx512, 8) => return avx512::block8::<T, WRITE>(a, b, dst),
                (Kernel::Avx512, 16) => return avx512::block16::<T, WRITE>(a, b, dst),
                (Kernel::Avx512, 32) => return avx512::block32::<T, WRITE>(a, b, dst),
                (Kernel::Avx512, 64) => return avx512::block64::<T, WRITE>(a, b, dst),
                (Kernel::Vp2intersect, 32) => return avx512::vp2i32::<T, WRITE>(a, b, dst),
                (Kernel::Vp2intersect, 64) => return avx512::vp2i64::<T, WRITE>(a, b, dst),
                _ => {}
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    if kernel == Kernel::Galloping {
        // SAFETY: forwarded caller promises.
        return unsafe { gallop::gallop_auto::<T, WRITE>(a, b, dst) };
    }
    // SAFETY: forwarded caller promises (the merge needs only `min(a.len(), b.len())`).
    unsafe { scalar::merge::<T, WRITE>(a, b, dst) }
}

/// Append the output of a resolved kernel to `out`.
fn run_into<T: SetElem>(kernel: Kernel, a: &[T], b: &[T], out: &mut Vec<T>) -> usize {
    if kernel == Kernel::Sse42 {
        return sse42_into(a, b, out);
    }
    let len = out.len();
    out.reserve(a.len().min(b.len()) + slack::<T>());
    // SAFETY: `kernel` came from `resolve`/`choose_kernel` and is not Sse42; the inputs are
    // strictly increasing by this module's contract; `reserve` made
    // `min(a.len(), b.len()) + slack` elements of spare capacity after `len`.
    let n = unsafe { run::<T, true>(kernel, a, b, out.as_mut_ptr().add(len)) };
    // SAFETY: the kernel initialised exactly `n` elements after `len`, within capacity.
    unsafe { out.set_len(len + n) };
    n
}

/// The SSE4.2 kernel (appends to `out` itself). Only called once `Sse42.usable::<T>()`.
fn sse42_into<T: SetElem>(a: &[T], b: &[T], out: &mut Vec<T>) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::any::TypeId;
        let id = TypeId::of::<T>();
        if id == TypeId::of::<u16>() {
            let (a, b, out) = (
                cast::<T, u16>(a),
                cast::<T, u16>(b),
                cast_vec::<T, u16>(out),
            );
            // SAFETY: usable() checked sse42_available(); inputs strictly increasing.
            return unsafe { sse42::intersect_u16(a, b, out) };
        }
        if id == TypeId::of::<i16>() {
            let (a, b, out) = (
                cast::<T, i16>(a),
                cast::<T, i16>(b),
                cast_vec::<T, i16>(out),
            );
            // SAFETY: as above.
            return unsafe { sse42::intersect_i16(a, b, out) };
        }
        if T::BITS == 32 {
            // SAFETY: as above; T is a 32-bit integer (sealed trait).
            return unsafe { sse42::intersect_u32_hier(a, b, out) };
        }
    }
    // Unreachable: Sse42 is only usable for u16, i16 and 32-bit types.
    run_into(Kernel::Scalar, a, b, out)
}

/// The SSE4.2 kernel, count only. Only called once `Sse42.usable::<T>()`.
fn sse42_count<T: SetElem>(a: &[T], b: &[T]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::any::TypeId;
        if TypeId::of::<T>() == TypeId::of::<u16>() {
            // SAFETY: usable() checked sse42_available(); inputs strictly increasing.
            return unsafe { sse42::intersect_count_u16(cast::<T, u16>(a), cast::<T, u16>(b)) };
        }
        if T::BITS == 32 {
            // SAFETY: as above; T is a 32-bit integer (sealed trait).
            return unsafe { sse42::intersect_count_u32_hier(a, b) };
        }
    }
    // i16 has no count-only SSE4.2 entry point: run it into a scratch buffer.
    let mut tmp = Vec::new();
    sse42_into(a, b, &mut tmp)
}

/// `s` as `&[U]` when `T` and `U` are the same type.
#[cfg(target_arch = "x86_64")]
fn cast<T: SetElem, U: SetElem>(s: &[T]) -> &[U] {
    assert_eq!(std::any::TypeId::of::<T>(), std::any::TypeId::of::<U>());
    // SAFETY: T and U are the same type (checked above).
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<U>(), s.len()) }
}

/// `v` as `&mut Vec<U>` when `T` and `U` are the same type.
#[cfg(target_arch = "x86_64")]
fn cast_vec<T: SetElem, U: SetElem>(v: &mut Vec<T>) -> &mut Vec<U> {
    assert_eq!(std::any::TypeId::of::<T>(), std::any::TypeId::of::<U>());
    // SAFETY: T and U are the same type (checked above), so the two Vec types are identical.
    unsafe { &mut *(v as *mut Vec<T>).cast::<Vec<U>>() }
}

/// Append `a ∩ b` (both strictly increasing in `T`'s order) to `out`, ascending. Returns the
/// number of values appended.
///
/// If `kernel` is unavailable on this CPU or has no implementation for `T`'s width, the best
/// available correct kernel runs instead (VP2INTERSECT → AVX-512 → AVX2 → SSE4.2 → scalar).
pub fn intersect<T: SetElem>(kernel: Kernel, a: &[T], b: &[T], out: &mut Vec<T>) -> usize {
    run_into(resolve::<T>(kernel), a, b, out)
}

/// `|a ∩ b|` for strictly increasing `a`, `b`, with `kernel` (fallback as in [`intersect`]).
/// Writes nothing.
pub fn intersect_count<T: SetElem>(kernel: Kernel, a: &[T], b: &[T]) -> usize {
    let k = resolve::<T>(kernel);
    count_with(k, a, b)
}

fn count_with<T: SetElem>(kernel: Kernel, a: &[T], b: &[T]) -> usize {
    if kernel == Kernel::Sse42 {
        return sse42_count(a, b);
    }
    // SAFETY: `kernel` is resolved and not Sse42; WRITE = false never touches `dst`.
    unsafe { run::<T, false>(kernel, a, b, std::ptr::null_mut()) }
}

// Hybrid policy, `Profile::Xeon`: measured on the first dev machine, Intel Xeon (Sapphire/Emerald
// Rapids class, AVX-512 with BW/VBMI2, no VP2INTERSECT), one thread, CPU time, caches flushed
// before each pass, pairs laid out back to back as in an Arrow column (~4M values per
// configuration), ~20% of the shorter list in common, values uniform. Harness: a scratch crate
// outside the repo (`examples/bench.rs sweep`), min of 3 passes. ns per pair, u32:
//
//   short  ratio |  scalar  gallop   avx2  avx512        short  ratio |  gallop   avx2  avx512
//       1      1 |    14.2    17.5   23.4    25.1           16     64 |     591    725     530
//       1      2 |    18.6    21.1   21.8    24.5           16     96 |     809   1113     801
//       1      8 |    34.0    27.4   21.4    23.1           24     32 |     589    554     590
//       1     16 |    49.0    18.1   32.9    26.5           24     48 |     706    838     884
//       2      2 |    27.8    35.3   24.0    25.0           32     64 |    1141   1528    1106
//       2     16 |   100.1    43.6   49.3    43.8           32     96 |    1459   2243    1641
//       4      8 |   120.5    50.7   48.0    47.6           64     48 |    1943   2285    1673
//       4     16 |   211.0    65.3   77.5    76.3           64     64 |    2105   3036    2185
//       8     32 |   868.1   222.4  190.4   290.7          256    128 |   19619  24111   17198
//       8     96 |  2574.8   467.2  538.2   495.4          256    192 |   25013  35203   25461
//      12     32 |  1363.3   335.7  333.3   413.2         1024    192 |  108789 146595  103413
//      12     48 |  2035.8   395.4  437.3   659.9         1024    256 |  112213 189660  136813
//
// So: the scalar merge only while the longer list has < 3 values; AVX2's single 8-lane
// block beats AVX-512's masked 16-lane one while the shorter list has <= 12 values;
// galloping from the ratios in `gallop_ratio`. u64 (`sweep64`): AVX2 (4 lanes) wins only
// up to 4 values (4x16: 94 vs avx512 133; 8x16: 177 vs 118), galloping from ~64x
// (16x64: avx512 824 vs gallop 874; 64x64: 3315 vs 2999; 512x128: 61105 vs 58558).
// 16/8-bit use the 32-bit table (u16, 16x64: avx512 860 vs sse42 898 vs gallop 1062).
//
// Zen 5 (AMD EPYC with VP2INTERSECT, 2026-11-26): `cargo bench --bench list_intersect --
// sweep/`, one thread, pairs back to back in ~16 M values (64-128 MB, past L3), criterion
// medians, ns per pair (table in benches/README.md). Galloping pays later on this CPU where
// the longer list is long (u32 128x128: block 5.9 us vs gallop 8.2; 1024x256: 94 vs 121 us;
// 12x48: 0.20 vs 0.27 us; gallop wins from 1024x512, 256x512, 128x256), a little earlier for
// tiny u64 lists (1x8, 2x16, 4x16); VP2INTERSECT wins only for short lists (u32 2x8..12x48,
// u64 up to 4 values: `small_block`), AVX-512 broadcasts from 16 values on (u64 by 1.3-1.5x
// over AVX2). Galloping over lists past the caches is latency-bound and varies +-50% from
// run to run at ratios >= 256; the block kernels vary by ~2%.
//
/// Gallop when `long >= gallop_ratio(short, T::BITS, profile) * short`.
const fn gallop_ratio(short: usize, bits: u32, profile: Profile) -> usize {
    if let Profile::Zen5 = profile {
        return match short {
            0..=1 if bits == 64 => 8,
            0..=7 => 16,
            8..=15 => 64,
            16..=31 => 96,
            32..=127 => 64,
            128..=511 => 256,
            _ => 512,
        };
    }
    if bits == 64 {
        return match short {
            0..=1 => 16,
            2..=255 => 64,
            _ => 128,
        };
    }
    match short {
        0..=7 => 16,
        8..=15 => 48,
        16..=127 => 64,
        128..=255 => 128,
        _ => 192,
    }
}
/// Use the scalar merge when the longer list is shorter than this (SIMD setup does not pay).
const SCALAR_MAX_LONG: usize = 3;
/// Up to this shorter length prefer the small-block kernel (`Features::small_block`): 12 for
/// 32-bit values (AVX2's 8 lanes), 4 for 64-bit ones (4 lanes).
const fn small_block_short(bits: u32) -> usize {
    if bits == 64 { 4 } else { 12 }
}

/// The hybrid policy: which kernel [`intersect_auto`] runs for lengths `len_a`, `len_b`.
///
/// Galloping when the lengths are skewed, the scalar merge when both are tiny, otherwise
/// the fastest block kernel this CPU has for `T` (AVX-512, AVX2, SSE4.2, scalar; for a very
/// short list VP2INTERSECT on Zen 5, else AVX2). Thresholds: see the measurements above
/// `gallop_ratio` in this file.
pub fn choose_kernel<T: SetElem>(len_a: usize, len_b: usize) -> Kernel {
    let (short, long) = if len_a <= len_b {
        (len_a, len_b)
    } else {
        (len_b, len_a)
    };
    if short == 0 {
        return Kernel::Scalar;
    }
    let f = features();
    if long >= gallop_ratio(short, T::BITS, f.profile).saturating_mul(short) {
        return Kernel::Galloping;
    }
    if long < SCALAR_MAX_LONG {
        return Kernel::Scalar;
    }
    if short <= small_block_short(T::BITS) {
        f.small_block[width_index(T::BITS)]
    } else {
        f.best_block[width_index(T::BITS)]
    }
}

/// `intersect(choose_kernel(a.len(), b.len()), a, b, out)`.
pub fn intersect_auto<T: SetElem>(a: &[T], b: &[T], out: &mut Vec<T>) -> usize {
    run_into(choose_kernel::<T>(a.len(), b.len()), a, b, out)
}

/// `intersect_count(choose_kernel(a.len(), b.len()), a, b)`.
pub fn intersect_count_auto<T: SetElem>(a: &[T], b: &[T]) -> usize {
    count_with(choose_kernel::<T>(a.len(), b.len()), a, b)
}

/// Like [`intersect_auto`] into raw spare capacity (for the k-way loop).
///
/// # Safety
/// `a`, `b` strictly increasing; when `WRITE`, `dst` valid for writes of
/// `min(a.len(), b.len()) + slack::<T>()` elements and not overlapping `a` or `b`.
pub(crate) unsafe fn auto_raw<T: SetElem, const WRITE: bool>(
    a: &[T],
    b: &[T],
    dst: *mut T,
) -> usize {
    // The SSE4.2 kernel only appends to a Vec: the scalar merge stands in for it here.
    let k = match choose_kernel::<T>(a.len(), b.len()) {
        Kernel::Sse42 => Kernel::Scalar,
        k => k,
    };
    // SAFETY: `k` is usable and not Sse42; the rest is the caller's promise.
    unsafe { run::<T, WRITE>(k, a, b, dst) }
}

/// [`intersect_auto`] on input whose order is not known: when `a` and `b` are both strictly
/// increasing, appends their common values to `out` and returns `Some(count)`; otherwise
/// returns `None` and leaves `out` as it was.
///
/// Where the policy picks the AVX-512 block kernel, the order is checked inside its block
/// loop, on values the kernel loads anyway (one pass over memory instead of a check's pass
/// and the kernel's); for every other kernel both slices are checked first ([`sortedness`]).
pub fn intersect_auto_checked<T: SetElem>(a: &[T], b: &[T], out: &mut Vec<T>) -> Option<usize> {
    let kernel = choose_kernel::<T>(a.len(), b.len());
    if kernel == Kernel::Avx512 {
        let len = out.len();
        out.reserve(a.len().min(b.len()) + slack::<T>());
        // SAFETY: the policy picks AVX-512 only where it is usable for `T`; `reserve` made
        // `min(a.len(), b.len()) + slack` elements of spare capacity after `len`; the checked
        // kernel needs no order.
        let n = unsafe { avx512_checked::<T, true>(a, b, out.as_mut_ptr().add(len)) }?;
        // SAFETY: the kernel initialised exactly `n` elements after `len`, within capacity.
        unsafe { out.set_len(len + n) };
        return Some(n);
    }
    both_strict(a, b).then(|| run_into(kernel, a, b, out))
}

/// `|a ∩ b|` as [`intersect_auto_checked`]: `None` unless both are strictly increasing.
pub fn intersect_count_auto_checked<T: SetElem>(a: &[T], b: &[T]) -> Option<usize> {
    let kernel = choose_kernel::<T>(a.len(), b.len());
    if kernel == Kernel::Avx512 {
        // SAFETY: AVX-512 is usable for `T` (the policy's choice); WRITE = false never
        // touches `dst`.
        return unsafe { avx512_checked::<T, false>(a, b, std::ptr::null_mut()) };
    }
    both_strict(a, b).then(|| count_with(kernel, a, b))
}

fn both_strict<T: SetElem>(a: &[T], b: &[T]) -> bool {
    sortedness(a) == Sortedness::Strict && sortedness(b) == Sortedness::Strict
}

/// The order-checking AVX-512 block kernel of `T`'s width.
///
/// # Safety
/// `Kernel::Avx512.usable::<T>()`; when `WRITE`, `dst` valid for writes of
/// `min(a.len(), b.len()) + slack::<T>()` elements.
unsafe fn avx512_checked<T: SetElem, const WRITE: bool>(
    a: &[T],
    b: &[T],
    dst: *mut T,
) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the caller checked that AVX-512 (with BW and VBMI2 for 8 and
        // 16 bits) is present, and the capacity at `dst`.
        unsafe {
            match T::BITS {
                8 => return avx512::block8_checked::<T, WRITE>(a, b, dst),
                16 => return avx512::block16_checked::<T, WRITE>(a, b, dst),
                32 => return avx512::block32_checked::<T, WRITE>(a, b, dst),
                64 => return avx512::block64_checked::<T, WRITE>(a, b, dst),
                _ => {}
            }
        }
    }
    // Unreachable (AVX-512 is never usable off x86-64): check, then merge.
    // SAFETY: the merge needs `min(a.len(), b.len())` elements at `dst` and sorted input.
    both_strict(a, b).then(|| unsafe { scalar::merge::<T, WRITE>(a, b, dst) })
}

/// Sorted with duplicates allowed (non-decreasing) `a`, `b`: append the distinct common
/// values, ascending, to `out`. Returns the number appended.
pub fn intersect_nondecreasing<T: SetElem>(a: &[T], b: &[T], out: &mut Vec<T>) -> usize {
    let len = out.len();
    out.reserve(a.len().min(b.len()));
    // SAFETY: spare capacity of `min(a.len(), b.len())` elements was reserved after `len`.
    let n = unsafe { scalar::merge_dedup::<T, true>(a, b, out.as_mut_ptr().add(len)) };
    // SAFETY: exactly `n` elements were initialised after `len`, within capacity.
    unsafe { out.set_len(len + n) };
    n
}

/// Number of distinct common values of non-decreasing `a`, `b`.
pub fn intersect_count_nondecreasing<T: SetElem>(a: &[T], b: &[T]) -> usize {
    // SAFETY: WRITE = false never touches `dst`.
    unsafe { scalar::merge_dedup::<T, false>(a, b, std::ptr::null_mut()) }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeSet;

    /// Test-only conversions for the eight element types.
    pub(crate) trait TestElem: SetElem {
        const LO: i128;
        const HI: i128;
        fn from_i128(v: i128) -> Self;
    }

    macro_rules! test_elem {
        ($($t:ty),*) => {$(
            impl TestElem for $t {
                const LO: i128 = <$t>::MIN as i128;
                const HI: i128 = <$t>::MAX as i128;
                fn from_i128(v: i128) -> Self {
                    v.clamp(Self::LO, Self::HI) as $t
                }
            }
        )*};
    }
    test_elem!(i8, i16, i32, i64, u8, u16, u32, u64);

    /// Reference: BTreeSet intersection, ascending.
    pub(crate) fn naive<T: Ord + Copy>(a: &[T], b: &[T]) -> Vec<T> {
        let s: BTreeSet<T> = a.iter().copied().collect();
        let t: BTreeSet<T> = b.iter().copied().collect();
        s.intersection(&t).copied().collect()
    }

    /// Strategy: a strictly increasing Vec of values from `elem`, length drawn from `len`.
    pub(crate) fn sorted_set<T: SetElem>(
        elem: impl Strategy<Value = T>,
        len: std::ops::Range<usize>,
    ) -> impl Strategy<Value = Vec<T>> {
        prop::collection::btree_set(elem, len).prop_map(|s| s.into_iter().collect())
    }

    /// Element strategy mixing dense clusters (near the type's minimum, zero and maximum:
    /// many matches, negatives, extremes) with values from the whole range (sparse).
    fn elem<T: TestElem>() -> impl Strategy<Value = T> {
        (0u8..5, any::<u64>()).prop_map(|(mode, r)| {
            let off = i128::from(r % 97);
            T::from_i128(match mode {
                0 => T::LO + off,
                1 => off - 48,
                2 => T::HI - off,
                3 => i128::from(r % 4096),
                _ => T::LO + i128::from(r) % (T::HI - T::LO + 1),
            })
        })
    }

    /// Strictly increasing random Vec of about `len` values in `[lo, hi]` (fewer if the
    /// domain is small).
    fn gen_set<T: TestElem>(rng: &mut StdRng, len: usize, lo: i128, hi: i128) -> Vec<T> {
        let (lo, hi) = (lo.max(T::LO), hi.min(T::HI));
        let span = (hi - lo + 1) as u128;
        let mut v: Vec<T> = (0..len)
            .map(|_| T::from_i128(lo + (rng.random::<u64>() as u128 % span) as i128))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Every kernel (available or not: unavailable ones exercise the fallback), both argument
    /// orders, counts, the hybrid, all on sub-slices at offsets 0..3 (alignment).
    pub(crate) fn check_all<T: SetElem>(a: &[T], b: &[T]) {
        let expect = naive(a, b);
        for off in 0..3 {
            let mut ba = vec![T::default(); off];
            ba.extend_from_slice(a);
            let mut bb = vec![T::default(); 2 - off];
            bb.extend_from_slice(b);
            let (a, b) = (&ba[off..], &bb[2 - off..]);
            for k in Kernel::ALL {
                for (x, y) in [(a, b), (b, a)] {
                    let mut out = vec![T::default(); off];
                    let n = intersect(k, x, y, &mut out);
                    assert_eq!(&out[off..], &expect[..], "{k:?} a={x:?} b={y:?}");
                    assert_eq!(n, expect.len(), "{k:?}");
                    assert_eq!(intersect_count(k, x, y), expect.len(), "{k:?} count");
                }
            }
            let mut out = Vec::new();
            assert_eq!(intersect_auto(a, b, &mut out), expect.len());
            assert_eq!(out, expect);
            assert_eq!(intersect_count_auto(a, b), expect.len());
            let mut out = Vec::new();
            assert_eq!(intersect_nondecreasing(a, b, &mut out), expect.len());
            assert_eq!(out, expect);
            for (x, y) in [(a, b), (b, a)] {
                let mut out = vec![T::default(); off];
                assert_eq!(intersect_auto_checked(x, y, &mut out), Some(expect.len()));
                assert_eq!(&out[off..], &expect[..], "checked a={x:?} b={y:?}");
                assert_eq!(intersect_count_auto_checked(x, y), Some(expect.len()));
                if Kernel::Avx512.usable::<T>() {
                    assert_eq!(checked_kernel(x, y).as_deref(), Some(&expect[..]));
                }
            }
        }
    }

    /// The order-checking AVX-512 kernel of `T`'s width, whatever the policy would pick.
    fn checked_kernel<T: SetElem>(a: &[T], b: &[T]) -> Option<Vec<T>> {
        assert!(Kernel::Avx512.usable::<T>());
        let mut out = Vec::with_capacity(a.len().min(b.len()) + slack::<T>());
        // SAFETY: AVX-512 usable for T (asserted); capacity min + slack.
        let n = unsafe { avx512_checked::<T, true>(a, b, out.as_mut_ptr()) };
        // SAFETY: count-only writes nothing.
        let c = unsafe { avx512_checked::<T, false>(a, b, std::ptr::null_mut()) };
        assert_eq!(n, c, "checked count");
        // SAFETY: on `Some(n)`, n values were written.
        n.map(|n| {
            // SAFETY: on `Some(n)`, n values were written.
            unsafe { out.set_len(n) };
            out
        })
    }

    /// Both checked entry points and the checked kernel refuse input with one neighbour pair
    /// out of strict order (descending or equal), wherever it is: inside a block, across a
    /// block boundary, in the part the block loop leaves to the tail, at either end; and
    /// `out` keeps what it held.
    fn checked_refuses<T: TestElem>(seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let shapes = [
            (2usize, 2usize),
            (16, 16),
            (17, 40),
            (33, 33),
            (100, 100),
            (64, 1000),
            (250, 260),
            (1000, 1000),
            (40, 5000),
            (5, 300),
        ];
        for (la, lb) in shapes {
            let span = 3 * (la + lb) as i128;
            let a = gen_set::<T>(&mut rng, la, -span, span);
            let b = gen_set::<T>(&mut rng, lb, -span, span);
            if a.len() < 2 || b.len() < 2 {
                continue;
            }
            for (side, base) in [(0, &a), (1, &b)] {
                let n = base.len();
                let mut at: Vec<usize> = [0, 1, 7, 14, 15, 16, 17, 31, 32, 63, 64, n / 2]
                    .into_iter()
                    .chain([n.saturating_sub(17), n.saturating_sub(3), n - 2])
                    .chain((0..4).map(|_| rng.random_range(0..n - 1)))
                    .filter(|&p| p + 1 < n)
                    .collect();
                at.sort_unstable();
                at.dedup();
                for p in at {
                    for how in 0..2 {
                        let mut bad = base.clone();
                        if how == 0 {
                            bad.swap(p, p + 1);
                        } else {
                            bad[p + 1] = bad[p];
                        }
                        let (x, y) = if side == 0 { (&bad, &b) } else { (&a, &bad) };
                        for (x, y) in [(&x[..], &y[..]), (&y[..], &x[..])] {
                            let mut out = vec![T::from_i128(3); 5];
                            let what = format!("{} bits, side {side}, at {p}, how {how}", T::BITS);
                            assert_eq!(intersect_auto_checked(x, y, &mut out), None, "{what}");
                            assert_eq!(out, vec![T::from_i128(3); 5], "{what}");
                            assert_eq!(intersect_count_auto_checked(x, y), None, "{what}");
                            if Kernel::Avx512.usable::<T>() {
                                assert_eq!(checked_kernel(x, y), None, "{what}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Unsorted input that makes the block loop match one block of `a` against many blocks
    /// of `b` (far more matches than `min(|a|, |b|)`): the checked kernel must not write past
    /// the capacity the caller reserved.
    #[test]
    fn checked_kernel_stays_in_bounds_on_repeats() {
        let mut a = vec![5u32; 15];
        a.extend(1000..1040);
        let b = vec![5u32; 10_000];
        assert_eq!(intersect_auto_checked(&a, &b, &mut Vec::new()), None);
        if Kernel::Avx512.usable::<u32>() {
            assert_eq!(checked_kernel(&a, &b), None);
            assert_eq!(checked_kernel(&b, &a), None);
            let a64: Vec<u64> = a.iter().map(|&x| u64::from(x)).collect();
            let b64 = vec![5u64; 10_000];
            assert_eq!(checked_kernel(&a64, &b64), None);
        }
    }

    fn deterministic<T: TestElem>(seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let lens = [
            0usize, 1, 2, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1000, 3000,
        ];
        // Domains: dense around 0, dense at the minimum, dense at the maximum, full range.
        let domains = |n: usize| {
            let n = n as i128;
            [
                (-n, 2 * n),
                (T::LO, T::LO + 3 * n),
                (T::HI - 3 * n, T::HI),
                (T::LO, T::HI),
            ]
        };
        for &la in &lens {
            for &lb in &lens {
                for (lo, hi) in domains(la.max(lb).max(8)) {
                    let a = gen_set::<T>(&mut rng, la, lo, hi);
                    let b = gen_set::<T>(&mut rng, lb, lo, hi);
                    check_all(&a, &b);
                }
            }
        }
        // Skews 1:1 .. 1:10000 with about 20% of the short list common.
        for ratio in [1usize, 3, 10, 50, 300, 1000, 10000] {
            for short in [1usize, 5, 20, 64] {
                let long = (short * ratio).min(200_000);
                let big = gen_set::<T>(&mut rng, long, T::LO / 2, T::HI / 2);
                let mut small = gen_set::<T>(&mut rng, short, T::LO / 2, T::HI / 2);
                for (i, s) in small.iter_mut().enumerate() {
                    if i % 5 == 0 {
                        *s = big[rng.random_range(0..big.len())];
                    }
                }
                small.sort_unstable();
                small.dedup();
                check_all(&small, &big);
            }
        }
    }

    macro_rules! per_type {
        ($($name:ident: $t:ty),*) => {$(
            mod $name {
                use super::*;
                #[test]
                fn deterministic_cases() {
                    deterministic::<$t>(<$t>::BITS as u64 + u64::from(<$t>::SIGNED));
                }
                #[test]
                fn checked_refuses_unordered_input() {
                    checked_refuses::<$t>(<$t>::BITS as u64 + u64::from(<$t>::SIGNED));
                }
                proptest! {
                    #![proptest_config(ProptestConfig::with_cases(64))]
                    #[test]
                    fn kernels_match_reference(
                        a in sorted_set(elem::<$t>(), 0..300),
                        b in sorted_set(elem::<$t>(), 0..300),
                    ) {
                        check_all(&a, &b);
                    }
                    #[test]
                    fn skewed_match_reference(
                        a in sorted_set(elem::<$t>(), 0..12),
                        b in sorted_set(elem::<$t>(), 200..1500),
                    ) {
                        check_all(&a, &b);
                    }
                    #[test]
                    fn nondecreasing_matches_reference(
                        mut a in prop::collection::vec(elem::<$t>(), 0..200),
                        mut b in prop::collection::vec(elem::<$t>(), 0..200),
                    ) {
                        a.sort_unstable();
                        b.sort_unstable();
                        let mut out = Vec::new();
                        let n = intersect_nondecreasing(&a, &b, &mut out);
                        prop_assert_eq!(&out, &naive(&a, &b));
                        prop_assert_eq!(n, out.len());
                        prop_assert_eq!(intersect_count_nondecreasing(&a, &b), n);
                        let s = sortedness(&a);
                        let mut d = a.clone();
                        d.dedup();
                        prop_assert_eq!(s == Sortedness::Strict, d.len() == a.len());
                    }
                }
            }
        )*};
    }
    per_type!(t_i8: i8, t_i16: i16, t_i32: i32, t_i64: i64, t_u8: u8, t_u16: u16, t_u32: u32,
              t_u64: u64);

    #[test]
    fn kernel_meta() {
        let names: Vec<_> = Kernel::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "scalar",
                "galloping",
                "sse42",
                "avx2",
                "avx512",
                "vp2intersect"
            ]
        );
        assert!(Kernel::Scalar.is_available() && Kernel::Galloping.is_available());
        for k in Kernel::ALL {
            for bits in [8, 16, 32, 64] {
                let r = match bits {
                    8 => resolve::<u8>(k),
                    16 => resolve::<i16>(k),
                    32 => resolve::<u32>(k),
                    _ => resolve::<i64>(k),
                };
                assert!(
                    r.is_available() && r.supports_width(bits),
                    "{k:?} {bits} -> {r:?}"
                );
                if k.is_available() && k.supports_width(bits) && (k != Kernel::Avx512 || bits >= 32)
                {
                    assert_eq!(r, k);
                }
            }
        }
        assert!(!Kernel::Sse42.supports_width(8) && !Kernel::Sse42.supports_width(64));
        assert_eq!(choose_kernel::<u32>(0, 100), Kernel::Scalar);
        assert_eq!(choose_kernel::<u32>(10, 100_000), Kernel::Galloping);
        assert_eq!(choose_kernel::<u32>(100_000, 10), Kernel::Galloping);
        assert_eq!(choose_kernel::<u32>(1000, 1000), best_block::<u32>());
        // The profile's table is the one applied: a 128 x 16,384 pair gallops on the Xeon
        // table (ratio 128) and merges on Zen 5's (ratio 256).
        let f = features();
        let expect = match f.profile {
            Profile::Xeon => Kernel::Galloping,
            Profile::Zen5 => f.best_block[width_index(32)],
        };
        assert_eq!(
            choose_kernel::<u32>(128, 128 * 128),
            expect,
            "{:?}",
            f.profile
        );
        assert_eq!(choose_kernel::<u32>(128, 128 * 512), Kernel::Galloping);
        if f.vp2intersect && f.profile == Profile::Zen5 {
            assert_eq!(choose_kernel::<u32>(8, 30), Kernel::Vp2intersect);
            assert_eq!(choose_kernel::<u64>(4, 20), Kernel::Vp2intersect);
            assert_eq!(choose_kernel::<u64>(1, 8), Kernel::Galloping);
        }
        fn chosen_usable<T: SetElem>() {
            for la in [0, 1, 2, 3, 5, 12, 13, 16, 100, 1000, 100_000] {
                for lb in [0, 1, 4, 64, 1000, 1 << 20] {
                    let k = choose_kernel::<T>(la, lb);
                    assert!(k.usable::<T>(), "{k:?} for {la}x{lb}, {} bits", T::BITS);
                    assert_eq!(k, choose_kernel::<T>(lb, la));
                }
            }
        }
        chosen_usable::<u8>();
        chosen_usable::<i16>();
        chosen_usable::<u32>();
        chosen_usable::<i64>();
    }

    #[test]
    fn order_bits_follow_order() {
        assert!((-1i8).order_bits() < 0i8.order_bits());
        assert!(i64::MIN.order_bits() < i64::MAX.order_bits());
        assert_eq!(u16::MAX.order_bits(), 0xffff);
        assert_eq!(i32::MIN.order_bits(), 0);
    }

    #[test]
    fn appends_after_existing_output() {
        let mut out = vec![9u32; 5];
        let a: Vec<u32> = (0..1000).collect();
        let b: Vec<u32> = (500..2000).step_by(2).collect();
        for k in Kernel::ALL {
            out.truncate(5);
            let n = intersect(k, &a, &b, &mut out);
            assert_eq!(n, 250);
            assert_eq!(&out[..5], &[9; 5]);
            assert_eq!(&out[5..], &naive(&a, &b)[..]);
        }
    }
}
