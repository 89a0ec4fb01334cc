//! Host reads for [`super::pinned_read_probe`]: a sum of u64 words by plain loads or by
//! streaming loads (SSE4.1 `MOVNTDQA`, which read write-combining memory a line at a time).
//!
//! Why the probe exists: the GPU machines' hosts were suspected of reading page-locked memory
//! slowly (a pass reading the query offsets back from the pinned upload buffer and writing
//! each query's mode there took 0.10-0.13 ms, where the same pass over ordinary memory took
//! 0.02-0.04, then a copy). The probe says otherwise for memory the device wrote by a copy
//! down: 19-24 GB/s with plain loads, as ordinary memory (22-26), and streaming loads no
//! faster (16-23), on the H200 hosts. Answers copied out of the pinned buffer with streaming
//! loads were no faster either (the `topk_bm25` GPU benchmark, tests/gpu_bm25.rs).

use std::sync::OnceLock;

/// Whether the processor has streaming loads (SSE4.1).
fn stream_loads() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("sse4.1")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The wrapping sum of `src`'s words, read by plain or (with SSE4.1) streaming loads.
pub(super) fn sum_words(src: &[u64], streaming: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if streaming && stream_loads() {
        // SAFETY: the processor has SSE4.1 (`stream_loads`).
        return unsafe { sum_stream(src) };
    }
    let _ = streaming;
    src.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

/// # Safety
/// On a processor with SSE4.1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn sum_stream(src: &[u64]) -> u64 {
    use std::arch::x86_64::{
        __m128i, _mm_add_epi64, _mm_extract_epi64, _mm_setzero_si128, _mm_stream_load_si128,
    };
    let p = src.as_ptr().cast::<u8>();
    let head = (p.align_offset(16) / 8).min(src.len());
    let mut sum = src[..head].iter().fold(0u64, |a, &w| a.wrapping_add(w));
    let body = &src[head..];
    let lines = body.len() / 2;
    let mut acc = _mm_setzero_si128();
    let b = body.as_ptr().cast::<__m128i>();
    for i in 0..lines {
        // SAFETY: `b + i` is 16-byte aligned and within `src`.
        acc = _mm_add_epi64(acc, unsafe { _mm_stream_load_si128(b.add(i)) });
    }
    sum = sum
        .wrapping_add(_mm_extract_epi64::<0>(acc) as u64)
        .wrapping_add(_mm_extract_epi64::<1>(acc) as u64);
    body[lines * 2..]
        .iter()
        .fold(sum, |a, &w| a.wrapping_add(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_alignment_both_ways() {
        let words: Vec<u64> = (0..103u64).map(|i| i * 0x9e37_79b9 + 1).collect();
        for from in 0..3 {
            let want = words[from..].iter().fold(0u64, |a, &w| a.wrapping_add(w));
            assert_eq!(sum_words(&words[from..], true), want);
            assert_eq!(sum_words(&words[from..], false), want);
        }
    }
}
