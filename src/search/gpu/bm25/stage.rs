//! A batch staged and planned on the host: each query's place (a device slot or the CPU's
//! share), its lists and its floor written straight into the pinned upload buffer, its
//! blocks and their launch order into a second one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use super::plan::{Blocks, WORK_BUCKETS};
use super::{Ctx, ITEM_BYTES, LISTREF_BYTES, Layout, ON_CPU, PIECE, Staged, malformed, mode_code};
use crate::backend::gpu::{GpuError, Workspace, align, view_mut};
use crate::search::gpu::Bm25Timings;

/// Queries per parallel task when staging a batch (measured on the H100 host, OR at k 10 on
/// 10,000 queries: the writing pass took 0.60-0.69 ms in groups of 512, 0.38-0.41 ms in groups
/// of 256, 128 or 64; its work is ~2.5 ms on one core, mostly cache misses).
const STAGE_GROUP: usize = 128;

/// Stage the batch: each query's place (a device slot or the CPU's share), its lists and its
/// floor, written straight into the pinned upload buffer (a counting pass and a writing pass
/// over groups of queries, in parallel); the writing pass also plans each query and builds
/// its group's blocks (a query, or a piece of one), which then go into a second pinned buffer
/// with their order, longest first.
///
/// `hold(bytes)` is asked for the pinned bytes the batch stages through (queries up and
/// results down, then the blocks too) before they are written; refused: `MemoryLimit`.
pub(super) fn stage(
    c: &Ctx<'_>,
    ws: &mut Workspace,
    hold: &mut dyn FnMut(usize) -> bool,
    t: &mut Bm25Timings,
) -> Result<Staged, GpuError> {
    let mut ask = |bytes: usize| match hold(bytes) {
        true => Ok(()),
        false => Err(GpuError::MemoryLimit(format!(
            "{bytes} bytes of topk_bm25's GPU staging"
        ))),
    };
    let ms = |since: Instant| since.elapsed().as_secs_f64() * 1e3;
    let (k, batch) = (c.k, c.batch);
    let nq = batch.len();
    let t_look = Instant::now();
    let group_of = |g: usize| g * STAGE_GROUP..((g + 1) * STAGE_GROUP).min(nq);
    // With the whole index resident, a query's place depends on its number of terms alone:
    // one pass on this thread (0.08 ms for 10,000 queries on the H100 host, 0.11 ms as a
    // parallel pass: within that host's spread).
    // The term ids themselves are checked by the writing pass, before they are looked up.
    let count = |g: usize| {
        let (mut q, mut l) = (0, 0);
        for i in group_of(g) {
            if c.takes(i) {
                q += 1;
                l += batch.terms(i).len();
            }
        }
        (q, l)
    };
    let n_groups = nq.div_ceil(STAGE_GROUP);
    let groups: Vec<(usize, usize)> = if c.res.all {
        (0..n_groups).map(count).collect()
    } else {
        (0..n_groups).into_par_iter().map(count).collect()
    };
    let gq: usize = groups.iter().map(|g| g.0).sum();
    let n_lists: usize = groups.iter().map(|g| g.1).sum();
    t.lookup_ms += ms(t_look);
    let mut part = Staged::new(nq, gq);
    if gq == 0 {
        for (r, (s, q)) in part.slot.iter_mut().zip(part.cpu_q.iter_mut()).enumerate() {
            *s = ON_CPU | r as u32;
            *q = r as u32;
        }
        t.stage_ms += ms(t_look);
        return Ok(part);
    }
    let t_fill = Instant::now();
    let mut lay = Layout {
        qoff: 0,
        ..Layout::default()
    };
    lay.mode = lay.qoff + align((gq + 1) * 4);
    lay.lists = lay.mode + align(gq);
    lay.floor = lay.lists + align(n_lists * LISTREF_BYTES);
    part.in_bytes = lay.floor + align(gq * 8);
    (part.out_bytes, part.down_bytes) = lay.answers(gq, k);
    ask(part.in_bytes + part.down_bytes)?;
    let in_bytes = part.in_bytes;
    let pin = &mut Workspace::pinned(&mut ws.pin_in, in_bytes)?.as_mut_slice()[..in_bytes];
    let (head, floors_b) = pin.split_at_mut(lay.floor);
    let floors_v = &mut view_mut::<f64>(floors_b)[..gq];
    let (head, lists_b) = head.split_at_mut(lay.lists);
    let (qoff_b, modes_b) = head.split_at_mut(lay.mode);
    let qoff = &mut view_mut::<u32>(qoff_b)[..gq + 1];
    qoff[gq] = n_lists as u32;
    let lists_v = &mut view_mut::<u64>(lists_b)[..2 * n_lists];
    let modes_v = &mut modes_b[..gq];
    // Split every output into the groups' shares.
    struct Share<'a> {
        first: usize,
        q0: usize,
        l0: usize,
        c0: usize,
        slot: &'a mut [u32],
        blocks: Blocks,
        qoff: &'a mut [u32],
        modes: &'a mut [u8],
        lists: &'a mut [u64],
        floors: &'a mut [f64],
        cpu_q: &'a mut [u32],
    }
    let mut shares = Vec::with_capacity(groups.len());
    {
        let (mut sl, mut qo, mut mo, mut li, mut fl, mut cq) = (
            part.slot.as_mut_slice(),
            &mut qoff[..gq],
            &mut *modes_v,
            &mut *lists_v,
            &mut *floors_v,
            part.cpu_q.as_mut_slice(),
        );
        let (mut q0, mut l0, mut c0) = (0, 0, 0);
        for (g, &(q, l)) in groups.iter().enumerate() {
            let r = group_of(g);
            let nq = r.len();
            let a;
            (a, sl) = std::mem::take(&mut sl).split_at_mut(nq);
            let d;
            (d, qo) = std::mem::take(&mut qo).split_at_mut(q);
            let e;
            (e, mo) = std::mem::take(&mut mo).split_at_mut(q);
            let f;
            (f, li) = std::mem::take(&mut li).split_at_mut(2 * l);
            let h;
            (h, fl) = std::mem::take(&mut fl).split_at_mut(q);
            let x;
            (x, cq) = std::mem::take(&mut cq).split_at_mut(nq - q);
            shares.push(Share {
                first: r.start,
                q0,
                l0,
                c0,
                slot: a,
                blocks: Blocks::default(),
                qoff: d,
                modes: e,
                lists: f,
                floors: h,
                cpu_q: x,
            });
            q0 += q;
            l0 += l;
            c0 += nq - q;
        }
    }
    let refs = &c.res.refs;
    let n_terms = c.index.terms();
    let beyond = AtomicBool::new(false);
    let fill_share = |s: &mut Share<'_>| {
        let (mut q, mut l, mut cq) = (0, 0, 0);
        for (r, slot) in s.slot.iter_mut().enumerate() {
            let i = s.first + r;
            if batch.terms(i).iter().any(|&t| t as usize >= n_terms) {
                beyond.store(true, Ordering::Relaxed);
                return;
            }
            if !c.takes(i) {
                *slot = ON_CPU | (s.c0 + cq) as u32;
                s.cpu_q[cq] = i as u32;
                cq += 1;
                continue;
            }
            *slot = (s.q0 + q) as u32;
            s.qoff[q] = (s.l0 + l) as u32;
            s.modes[q] = mode_code(batch.mode(i));
            let p = c.plan_of(i);
            s.floors[q] = p.floor;
            s.blocks.push((s.q0 + q) as u32, &p);
            for &tm in batch.terms(i) {
                s.lists[2 * l..2 * l + 2].copy_from_slice(&refs[tm as usize]);
                l += 1;
            }
            q += 1;
        }
    };
    shares.par_iter_mut().for_each(fill_share);
    t.fill_ms += ms(t_fill);
    if beyond.into_inner() {
        return Err(malformed());
    }

    // The groups' blocks, then the longest first: a counting sort on buckets of work
    // (descending), stable.
    let t_sort = Instant::now();
    let blocks: Vec<Blocks> = shares.into_iter().map(|s| s.blocks).collect();
    let n_items: usize = blocks.iter().map(|b| b.items.len()).sum();
    let n_pieces: usize = blocks.iter().map(|b| b.pieces as usize).sum();
    let n_split: usize = blocks.iter().map(|b| b.splits.len()).sum();
    t.pieces += n_pieces;
    (part.n_items, part.n_pieces, part.n_split) = (n_items, n_pieces, n_split);
    lay.order = 0;
    lay.items = align(n_items * 4);
    lay.splitq = lay.items + align(n_items * ITEM_BYTES);
    lay.splitp = lay.splitq + align(n_split * 4);
    part.items_bytes = lay.splitp + align((n_split + 1) * 4);
    lay.pord = align(n_pieces * 4);
    lay.pscore = lay.pord + align(n_pieces * k * 4);
    lay.and = lay.pscore + align(n_pieces * k * 8);
    lay.done = lay.and + align(gq * 4);
    lay.piece_bytes = lay.done;
    ask(part.in_bytes + part.items_bytes + part.down_bytes)?;
    let items_bytes = part.items_bytes;
    let pin = &mut Workspace::pinned(&mut ws.pin_aux, items_bytes)?.as_mut_slice()[..items_bytes];
    let (head, splitp_b) = pin.split_at_mut(lay.splitp);
    let (head, splitq_b) = head.split_at_mut(lay.splitq);
    let (order_b, items_b) = head.split_at_mut(lay.items);
    let order_v = &mut view_mut::<u32>(order_b)[..n_items];
    let items_v = &mut view_mut::<u32>(items_b)[..4 * n_items];
    let splitq_v = &mut view_mut::<u32>(splitq_b)[..n_split];
    let splitp_v = &mut view_mut::<u32>(splitp_b)[..n_split + 1];
    // Each group's piece slots follow the groups before it.
    let (mut at, mut sq, mut base) = (0usize, 0usize, 0u32);
    for b in &blocks {
        for (dst, src) in items_v[4 * at..].chunks_exact_mut(4).zip(&b.items) {
            let mut item = *src;
            if item[3] & PIECE == PIECE {
                item[3] += base;
            }
            dst.copy_from_slice(&item);
        }
        at += b.items.len();
        for &[q, end] in &b.splits {
            splitq_v[sq] = q;
            sq += 1;
            splitp_v[sq] = base + end;
        }
        base += b.pieces;
    }
    splitp_v[0] = 0;
    let keys = || blocks.iter().flat_map(|b| b.keys.iter().copied());
    let mut start = [0u32; WORK_BUCKETS + 1];
    for b in keys() {
        start[WORK_BUCKETS - 1 - b as usize + 1] += 1;
    }
    for b in 1..=WORK_BUCKETS {
        start[b] += start[b - 1];
    }
    for (j, b) in keys().enumerate() {
        let at = &mut start[WORK_BUCKETS - 1 - b as usize];
        order_v[*at as usize] = j as u32;
        *at += 1;
    }
    part.layout = lay;
    t.sort_ms += ms(t_sort);
    t.stage_ms += ms(t_look);
    Ok(part)
}
