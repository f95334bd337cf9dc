//! Per-peer bounded send queue, written with vectored writes.
//!
//! Frames are queued as segments: a large payload is referenced as-is (never copied) behind its
//! encoded header; a small payload (at most [`SEND_COALESCE_MAX_PAYLOAD`] bytes) is copied,
//! together with its header, into a shared contiguous buffer (at most
//! [`SEND_COALESCE_BUFFER_BYTES`] each), so a burst of tiny frames is written with one `IoSlice`
//! rather than two per frame.
//!
//! A payload may come in two parts ([`Payload::two`]): a short head (a collective message's own
//! header) and a shared body (a broadcast's payload, one `Bytes` for every child). Both are
//! referenced as-is, never copied, unless the whole payload is small enough to coalesce: a
//! packing buffer holds whole frames only.
//!
//! Driver loop: `let n = q.io_slices(&mut iov, true); let w = sock.write_vectored(&iov[..n])?;
//! q.advance(w);` until the socket would block or the queue is empty. A caller that keeps what
//! it wrote (a link session) calls [`advance_with`](SendQueue::advance_with) instead and is
//! handed each written stretch as a [`Written`]: a packing buffer is handed over whole once
//! written, not copied, so keeping small frames costs no copy.

use std::collections::VecDeque;
use std::fmt;
use std::io::IoSlice;

use bytes::{Bytes, BytesMut};

use super::header::{HEADER_LEN, Header};
use super::session::is_session_kind;
use crate::limits::{SEND_COALESCE_BUFFER_BYTES, SEND_COALESCE_MAX_PAYLOAD};

/// A packing buffer grows past `SEND_COALESCE_BUFFER_BYTES` by at most one frame, and doubles
/// as it grows; one of at most this capacity is kept for reuse.
const SPARE_MAX_BYTES: usize = 2 * SEND_COALESCE_BUFFER_BYTES;

/// A frame was refused because the queue is at its bound. Nothing was queued; the caller keeps
/// its payload (a `Bytes` clone is cheap) and applies back-pressure or reports an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueFull {
    /// Bytes already queued (headers included).
    pub queued: usize,
    /// Wire size of the refused frame (header + payload).
    pub frame: usize,
    /// The queue's bound.
    pub max: usize,
}

impl fmt::Display for QueueFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "send queue full: {} bytes queued + {}-byte frame exceeds the bound of {} bytes",
            self.queued, self.frame, self.max
        )
    }
}

impl std::error::Error for QueueFull {}

/// A frame's payload: one buffer, or a head followed by a body, sent back to back as one
/// payload (the header's `len` covers both). Cloning shares both buffers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Payload {
    head: Bytes,
    body: Bytes,
}

impl Payload {
    /// `head` then `body`, one payload on the wire; neither is copied unless the whole is small.
    pub fn two(head: Bytes, body: Bytes) -> Self {
        Payload { head, body }
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len().saturating_add(self.body.len())
    }

    /// Whether there are no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.body.is_empty()
    }

    /// The first part (the whole payload of a one-part payload).
    pub fn head(&self) -> &Bytes {
        &self.head
    }

    /// The second part (empty for a one-part payload).
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The payload as one buffer: free for a one-part payload, a copy otherwise.
    pub fn to_bytes(&self) -> Bytes {
        if self.body.is_empty() {
            return self.head.clone();
        }
        if self.head.is_empty() {
            return self.body.clone();
        }
        let mut b = BytesMut::with_capacity(self.len());
        b.extend_from_slice(&self.head);
        b.extend_from_slice(&self.body);
        b.freeze()
    }
}

impl From<Bytes> for Payload {
    fn from(head: Bytes) -> Self {
        Payload {
            head,
            body: Bytes::new(),
        }
    }
}

/// A stretch of the queue completely written, handed to [`SendQueue::advance_with`]'s caller
/// in the order written. Only session frames (`oob::session::is_session_kind`) are handed
/// over.
#[derive(Debug, Clone)]
pub enum Written {
    /// One frame, by reference: its header (`len` set) and payload.
    Frame(Header, Payload),
    /// `frames` small frames, header then payload each, back to back, as written.
    Packed { bytes: Bytes, frames: usize },
}

impl Written {
    /// How many frames it is.
    pub fn frames(&self) -> usize {
        match self {
            Written::Frame(..) => 1,
            Written::Packed { frames, .. } => *frames,
        }
    }

    /// Its bytes on the wire.
    pub fn wire_len(&self) -> usize {
        match self {
            Written::Frame(_, p) => HEADER_LEN + p.len(),
            Written::Packed { bytes, .. } => bytes.len(),
        }
    }

    /// Its frames one by one, the first `skip` left out. A packed stretch holds only what the
    /// queue encoded, so a header that does not read back is a bug; it ends the stretch (what
    /// follows cannot be framed).
    pub fn into_frames(self, skip: usize) -> Vec<(Header, Payload)> {
        match self {
            Written::Frame(header, payload) if skip == 0 => vec![(header, payload)],
            Written::Frame(..) => Vec::new(),
            Written::Packed { bytes, frames } => {
                let mut out = Vec::with_capacity(frames.saturating_sub(skip));
                let mut at = 0;
                for i in 0..frames {
                    let Some((header, end)) = packed_frame_at(&bytes, at) else {
                        crate::bug!(
                            "frame {i} of {frames} of a written stretch does not read back"
                        );
                        break;
                    };
                    if i >= skip {
                        out.push((header, Payload::from(bytes.slice(at + HEADER_LEN..end))));
                    }
                    at = end;
                }
                out
            }
        }
    }

    /// The same stretch without its first `skip` frames (`None` when nothing is left).
    pub fn skip(self, skip: usize) -> Option<Written> {
        if skip == 0 {
            return Some(self);
        }
        match self {
            Written::Frame(..) => None,
            Written::Packed { bytes, frames } => {
                let mut at = 0;
                for i in 0..skip.min(frames) {
                    let Some((_, end)) = packed_frame_at(&bytes, at) else {
                        crate::bug!(
                            "frame {i} of {frames} of a written stretch does not read back"
                        );
                        return None;
                    };
                    at = end;
                }
                (skip < frames).then(|| Written::Packed {
                    bytes: bytes.slice(at..),
                    frames: frames - skip,
                })
            }
        }
    }
}

/// The header of the packed frame starting at `at`, and where the frame ends.
fn packed_frame_at(bytes: &[u8], at: usize) -> Option<(Header, usize)> {
    let raw = bytes.get(at..at.checked_add(HEADER_LEN)?)?;
    let header = Header::decode(<&[u8; HEADER_LEN]>::try_from(raw).ok()?).ok()?;
    let end = at
        .checked_add(HEADER_LEN)?
        .checked_add(header.len as usize)?;
    (end <= bytes.len()).then_some((header, end))
}

/// A contiguous run of bytes to write.
#[derive(Debug)]
enum Seg {
    Header([u8; HEADER_LEN]),
    Payload(Bytes),
    /// Several small frames, header and payload each, back to back: whole frames only, all
    /// session frames or none (`session`). Only the last segment of the queue is ever appended
    /// to.
    Packed {
        buf: BytesMut,
        frames: usize,
        session: bool,
    },
}

impl Seg {
    fn bytes(&self) -> &[u8] {
        match self {
            Seg::Header(h) => h,
            Seg::Payload(p) => p,
            Seg::Packed { buf, .. } => buf,
        }
    }
}

#[derive(Debug)]
struct QueuedFrame {
    header: Header,
    payload: Payload,
    wire_len: usize,
    /// Written from a packing buffer (whole, in one `Seg::Packed`).
    packed: bool,
}

/// Frames waiting to be written to one peer, in order, bounded in bytes.
#[derive(Debug)]
pub struct SendQueue {
    segs: VecDeque<Seg>,
    /// Bytes of `segs.front()` already written.
    seg_off: usize,
    frames: VecDeque<QueuedFrame>,
    /// Bytes of `frames.front()` already written.
    frame_off: usize,
    /// Unwritten bytes in the queue.
    queued: usize,
    max_bytes: usize,
    /// A written packing buffer kept for the next one (its capacity, empty): a steady stream of
    /// small frames then packs without allocating or faulting in fresh pages. Given back by
    /// [`release_idle`](Self::release_idle).
    spare: Option<BytesMut>,
    /// Frames of the front packing buffer completely written; the buffer is handed over (or
    /// reused) once all of its frames are.
    packed_done: usize,
    /// Packing buffers written to their end in one `advance`, until their last frames are
    /// counted (kept to save an allocation per call).
    popped: VecDeque<(BytesMut, usize, bool)>,
    /// The capacity of the last packing buffer written: a new one without a spare starts at
    /// it, so a stream whose written buffers are handed over (and come back only when
    /// acknowledged) does not grow each new one from nothing.
    packed_cap: usize,
    /// A header-only control frame written at the next frame boundary, ahead of the frames
    /// still unwritten (see [`set_control`](Self::set_control)), with its bytes written.
    control: Option<([u8; HEADER_LEN], usize)>,
    /// The next control frame, while one is partly written.
    control_next: Option<[u8; HEADER_LEN]>,
}

impl SendQueue {
    /// An empty queue holding at most `max_bytes` unwritten bytes (see [`push`](Self::push)).
    /// Default bound: `limits::SEND_QUEUE_MAX_BYTES_DEFAULT`.
    pub fn new(max_bytes: usize) -> Self {
        SendQueue {
            segs: VecDeque::new(),
            seg_off: 0,
            frames: VecDeque::new(),
            frame_off: 0,
            queued: 0,
            max_bytes,
            spare: None,
            packed_done: 0,
            packed_cap: 0,
            popped: VecDeque::new(),
            control: None,
            control_next: None,
        }
    }

    /// Queue one frame. The header is encoded now with `len` set from `payload.len()` (the
    /// caller's `header.len` is ignored); a large payload (or the body of a two-part one) is
    /// shared, never copied.
    ///
    /// Fails with [`QueueFull`] (nothing queued) when the unwritten bytes plus this frame would
    /// exceed the bound, except that an empty queue always accepts one frame, so a frame larger
    /// than the bound can still be sent. A payload longer than `u32::MAX` cannot be framed: the
    /// caller must enforce the message maximum (`limits::MSG_MAX_BYTES_DEFAULT`) before this.
    pub fn push(&mut self, header: &Header, payload: impl Into<Payload>) -> Result<(), QueueFull> {
        let payload = payload.into();
        let wire_len = HEADER_LEN + payload.len();
        if !self.is_empty() && self.queued.saturating_add(wire_len) > self.max_bytes {
            return Err(QueueFull {
                queued: self.queued,
                frame: wire_len,
                max: self.max_bytes,
            });
        }
        self.push_unbounded(header, payload);
        Ok(())
    }

    /// Queues one frame whatever the bound: for frames written once already and written again
    /// on a new connection (`oob::session`), which were accepted under their own bound.
    pub fn push_unbounded(&mut self, header: &Header, payload: impl Into<Payload>) {
        let payload = payload.into();
        let wire_len = HEADER_LEN + payload.len();
        let len = u32::try_from(payload.len()).unwrap_or_else(|_| {
            log::error!(
                "payload of {} bytes cannot be framed; the header will be wrong",
                payload.len()
            );
            u32::MAX
        });
        let header = Header { len, ..*header };
        let encoded = header.encode();
        let (head, body) = (&payload.head, &payload.body);
        let packed = payload.len() <= SEND_COALESCE_MAX_PAYLOAD;
        if packed {
            self.pack(&[&encoded, head, body], is_session_kind(header.kind));
        } else {
            self.segs.push_back(Seg::Header(encoded));
            self.segs.push_back(Seg::Payload(head.clone()));
            if !body.is_empty() {
                self.segs.push_back(Seg::Payload(body.clone()));
            }
        }
        self.frames.push_back(QueuedFrame {
            header,
            payload,
            wire_len,
            packed,
        });
        self.queued += wire_len;
    }

    /// Writes a header-only control frame (`encoded`) at the next frame boundary, ahead of the
    /// frames still unwritten, and even when [`io_slices`](Self::io_slices) is asked for no
    /// data. A control frame not yet started is replaced (the latest counts: link
    /// acknowledgements are cumulative); one partly written is finished first.
    pub fn set_control(&mut self, encoded: [u8; HEADER_LEN]) {
        match &mut self.control {
            Some((_, off)) if *off > 0 => self.control_next = Some(encoded),
            slot => *slot = Some((encoded, 0)),
        }
    }

    /// Whether a control frame waits to be written.
    pub fn has_control(&self) -> bool {
        self.control.is_some()
    }

    /// Whether the control frame goes before the data: it waits for a frame boundary.
    fn control_first(&self) -> bool {
        self.control.is_some() && self.frame_off == 0
    }

    /// Copies one frame's `parts` to the end of the last shared buffer (a new one if the last
    /// segment is not a buffer, is full, or holds the other class of frame: `session`).
    fn pack(&mut self, parts: &[&[u8]], session: bool) {
        let append = match self.segs.back() {
            Some(Seg::Packed {
                buf, session: s, ..
            }) => buf.len() < SEND_COALESCE_BUFFER_BYTES && *s == session,
            _ => false,
        };
        if !append {
            let cap = self.packed_cap.min(SPARE_MAX_BYTES);
            let buf = self
                .spare
                .take()
                .unwrap_or_else(|| BytesMut::with_capacity(cap));
            self.segs.push_back(Seg::Packed {
                buf,
                frames: 0,
                session,
            });
        }
        if let Some(Seg::Packed { buf, frames, .. }) = self.segs.back_mut() {
            for p in parts {
                buf.extend_from_slice(p);
            }
            *frames += 1;
        }
    }

    /// Takes `buf` as the next packing buffer if none is kept (a caller that was handed
    /// packing buffers gives them back once it lets them go).
    pub fn offer_spare(&mut self, mut buf: BytesMut) {
        if self.spare.is_none() && buf.capacity() <= SPARE_MAX_BYTES {
            buf.clear();
            self.spare = Some(buf);
        }
    }

    /// Whether the queue keeps no packing buffer for reuse.
    pub fn wants_spare(&self) -> bool {
        self.spare.is_none()
    }

    /// Keeps `buf` for reuse, or frees it.
    fn recycle(&mut self, buf: BytesMut) {
        self.offer_spare(buf);
    }

    /// Fill `out` with slices covering the unwritten bytes in order, at most `out.len()` of
    /// them (pass `limits::IOV_MAX_SLICES`); returns how many were filled. Pass
    /// `&out[..n]` to `write_vectored`, then call [`advance`](Self::advance) with its result.
    ///
    /// With `data` false only a control frame is offered (see
    /// [`set_control`](Self::set_control)), after the rest of a partly written frame (a frame
    /// once started is always finished, so a control frame can follow). While a control
    /// frame waits behind a partly written frame, the slices end with that frame, so the
    /// control goes next.
    pub fn io_slices<'a>(&'a self, out: &mut [IoSlice<'a>], data: bool) -> usize {
        self.io_slices_within(out, data, usize::MAX)
    }

    /// As [`io_slices`](Self::io_slices), with at most `max` bytes of frames (a control frame
    /// offered first is not counted): a connection whose writes per turn are bounded.
    pub fn io_slices_within<'a>(
        &'a self,
        out: &mut [IoSlice<'a>],
        data: bool,
        max: usize,
    ) -> usize {
        let mut filled = 0;
        let control_now = self.control_first();
        if control_now
            && let Some((c, off)) = &self.control
            && let Some(slot) = out.get_mut(0)
        {
            *slot = IoSlice::new(c.get(*off..).unwrap_or(&[]));
            filled = 1;
        }
        let rest_of_front = || {
            self.frames
                .front()
                .map_or(0, |f| f.wire_len.saturating_sub(self.frame_off))
        };
        let mut budget = if control_now {
            // Data goes behind the control frame only when data is wanted.
            if data { usize::MAX } else { 0 }
        } else if self.frame_off > 0 && (!data || self.control.is_some()) {
            // Finish the started frame, and no more: held back, or a control frame next.
            rest_of_front()
        } else if data {
            usize::MAX
        } else {
            0
        }
        .min(max);
        if budget == 0 {
            return filled;
        }
        let mut skip = self.seg_off;
        for seg in &self.segs {
            if filled == out.len() || budget == 0 {
                break;
            }
            let bytes = seg.bytes().get(skip..).unwrap_or(&[]);
            skip = 0;
            if bytes.is_empty() {
                continue;
            }
            let bytes = bytes.get(..budget.min(bytes.len())).unwrap_or(bytes);
            budget = budget.saturating_sub(bytes.len());
            if let Some(slot) = out.get_mut(filled) {
                *slot = IoSlice::new(bytes);
                filled += 1;
            }
        }
        filled
    }

    /// Record that `n` bytes were written (a partial write may end mid-frame). Returns how many
    /// frames are now completely written. `n` beyond the queued bytes is a driver bug: it is
    /// clamped and logged.
    pub fn advance(&mut self, n: usize) -> usize {
        self.advance_inner(n, None)
    }

    /// [`advance`](Self::advance), handing what was completely written to `written`, in
    /// order: each packing buffer once all its frames are written, and each other frame once
    /// written. Only session frames are handed over (control and handshake frames are not).
    pub fn advance_with(&mut self, n: usize, mut written: impl FnMut(Written)) -> usize {
        self.advance_inner(n, Some(&mut written))
    }

    fn advance_inner(&mut self, n: usize, mut written: Option<&mut dyn FnMut(Written)>) -> usize {
        let mut n = n;
        if self.control_first()
            && let Some((_, off)) = &mut self.control
        {
            let take = n.min(HEADER_LEN.saturating_sub(*off));
            *off += take;
            n -= take;
            if *off >= HEADER_LEN {
                self.control = self.control_next.take().map(|c| (c, 0));
            }
        }
        if n > self.queued {
            log::error!(
                "SendQueue::advance({n}) exceeds the {} queued bytes",
                self.queued
            );
        }
        let n = n.min(self.queued);
        self.queued -= n;

        // Packing buffers written to their end, in order: each is handed over (or reused)
        // when the last of its frames is counted below, in the same call.
        let mut popped = std::mem::take(&mut self.popped);
        let mut left = n;
        while left > 0 {
            let Some(seg) = self.segs.front() else { break };
            let rest = seg.bytes().len().saturating_sub(self.seg_off);
            if left >= rest {
                left -= rest;
                if let Some(Seg::Packed {
                    buf,
                    frames,
                    session,
                }) = self.segs.pop_front()
                {
                    self.packed_cap = buf.capacity();
                    popped.push_back((buf, frames, session));
                }
                self.seg_off = 0;
            } else {
                self.seg_off += left;
                left = 0;
            }
        }

        let mut left = n;
        let mut done = 0;
        while left > 0 {
            let Some(f) = self.frames.front() else { break };
            let rest = f.wire_len.saturating_sub(self.frame_off);
            if left >= rest {
                left -= rest;
                if let Some(f) = self.frames.pop_front() {
                    if f.packed {
                        self.packed_done += 1;
                        if popped.front().is_some_and(|p| p.1 <= self.packed_done)
                            && let Some((buf, frames, session)) = popped.pop_front()
                        {
                            self.packed_done = 0;
                            match written.as_mut() {
                                Some(w) if session => w(Written::Packed {
                                    bytes: buf.freeze(),
                                    frames,
                                }),
                                _ => self.recycle(buf),
                            }
                        }
                    } else if let Some(w) = written.as_mut()
                        && is_session_kind(f.header.kind)
                    {
                        w(Written::Frame(f.header, f.payload));
                    }
                }
                self.frame_off = 0;
                done += 1;
            } else {
                self.frame_off += left;
                left = 0;
            }
        }
        for (buf, frames, _) in popped.drain(..) {
            crate::bug!("a written packing buffer's {frames} frames were not all counted");
            self.recycle(buf);
        }
        self.popped = popped;
        done
    }

    /// For a connection that broke: the frames of the front packing buffer already written
    /// (their buffer is still queued), as one copied stretch, if they are session frames. The
    /// caller then takes [`started`](Self::started) and drains the rest.
    pub fn written_in_front(&self) -> Option<Written> {
        if self.packed_done == 0 {
            return None;
        }
        let Some(Seg::Packed {
            buf, session: true, ..
        }) = self.segs.front()
        else {
            return None;
        };
        // The front frame, if started, is the first one not written.
        let end = self.seg_off.saturating_sub(self.frame_off);
        let bytes = Bytes::copy_from_slice(buf.get(..end)?);
        Some(Written::Packed {
            bytes,
            frames: self.packed_done,
        })
    }

    /// Gives back the spare packing buffer while nothing is queued (an idle connection keeps no
    /// buffer). True if memory was released.
    pub fn release_idle(&mut self) -> bool {
        self.is_empty() && self.spare.take().is_some()
    }

    /// Whether nothing is left to write.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Unwritten bytes, headers included.
    pub fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// Frames not completely written (a partly written one included).
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether the front frame has been partly written (it cannot be drained: the peer has seen
    /// its start, so the rest must follow on this connection or the connection be closed).
    pub fn front_in_progress(&self) -> bool {
        self.frame_off > 0
    }

    /// The bound given to [`new`](Self::new).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The partly written front frame, for a connection that broke: its header and payload,
    /// with its wire length. The caller then drains the rest with
    /// [`drain_unsent`](Self::drain_unsent) and drops this queue (its byte segments still
    /// hold the started frame).
    pub fn started(&self) -> Option<(Header, Payload, usize)> {
        if self.frame_off == 0 {
            return None;
        }
        self.frames
            .front()
            .map(|f| (f.header, f.payload.clone(), f.wire_len))
    }

    /// Remove and return, in order, every frame of which no byte has been written (for
    /// re-routing when a link dies). A partly written front frame stays queued; see
    /// [`front_in_progress`](Self::front_in_progress). The returned headers have `len` set.
    pub fn drain_unsent(&mut self) -> Vec<(Header, Payload)> {
        let keep = usize::from(self.frame_off > 0);
        let unsent: Vec<QueuedFrame> = self.frames.drain(keep.min(self.frames.len())..).collect();
        let mut remove: usize = unsent.iter().map(|f| f.wire_len).sum();
        let mut unsent_packed = unsent.iter().filter(|f| f.packed).count();
        self.queued -= remove.min(self.queued);
        // The unsent frames are a suffix of the byte stream, ending on a frame boundary.
        while remove > 0 {
            let front_started = self.segs.len() == 1 && self.seg_off > 0;
            let Some(seg) = self.segs.back_mut() else {
                break;
            };
            let seg_len = seg.bytes().len();
            if seg_len <= remove && !front_started {
                remove -= seg_len;
                if let Some(Seg::Packed { frames, .. }) = self.segs.pop_back() {
                    unsent_packed = unsent_packed.saturating_sub(frames);
                }
            } else if let Seg::Packed { buf, frames, .. } = seg {
                // The unsent frames it holds are its last ones.
                buf.truncate(seg_len.saturating_sub(remove));
                *frames = frames.saturating_sub(unsent_packed);
                unsent_packed = 0;
                remove = 0;
            } else {
                log::error!("SendQueue::drain_unsent: segment boundary mismatch");
                break;
            }
        }
        if self.segs.is_empty() {
            self.seg_off = 0;
            self.packed_done = 0;
        }
        unsent.into_iter().map(|f| (f.header, f.payload)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oob::header::Kind;

    fn hdr(seq: u64) -> Header {
        Header {
            kind: Kind::Msg,
            origin: 1,
            dst: 2,
            tag: 3,
            epoch: 4,
            seq,
            len: 0,
            lives: 0,
        }
    }

    fn payload(i: usize, len: usize) -> Bytes {
        Bytes::from((0..len).map(|b| (b + i * 13) as u8).collect::<Vec<_>>())
    }

    const SIZES: [usize; 8] = [0, 1, 256, 257, 1000, 3, 0, 5000];

    fn fill(q: &mut SendQueue) -> (Vec<u8>, Vec<(Header, Payload)>) {
        let mut stream = Vec::new();
        let mut frames = Vec::new();
        for (i, &len) in SIZES.iter().enumerate() {
            let p = payload(i, len);
            let h = Header {
                len: len as u32,
                ..hdr(i as u64)
            };
            q.push(&h, p.clone()).expect("room");
            stream.extend_from_slice(&h.encode());
            stream.extend_from_slice(&p);
            frames.push((h, p.into()));
        }
        (stream, frames)
    }

    /// Two-part frames of every shape (small or large head and body, empty parts) between
    /// one-part frames.
    const PARTS: [(usize, usize); 7] = [
        (29, 0),
        (29, 10),
        (29, 1000),
        (0, 700),
        (600, 500),
        (300, 0),
        (10, 246),
    ];

    fn fill_parts(q: &mut SendQueue) -> (Vec<u8>, Vec<(Header, Payload)>) {
        let mut stream = Vec::new();
        let mut frames = Vec::new();
        for (i, &(head, body)) in PARTS.iter().enumerate() {
            let p = Payload::two(payload(i, head), payload(i + 100, body));
            let h = Header {
                len: p.len() as u32,
                ..hdr(i as u64)
            };
            q.push(&h, p.clone()).expect("room");
            stream.extend_from_slice(&h.encode());
            stream.extend_from_slice(&p.to_bytes());
            frames.push((h, p));
            let one = payload(i + 50, 7 * i);
            let h = Header {
                len: one.len() as u32,
                ..hdr(1000 + i as u64)
            };
            q.push(&h, one.clone()).expect("room");
            stream.extend_from_slice(&h.encode());
            stream.extend_from_slice(&one);
            frames.push((h, one.into()));
        }
        (stream, frames)
    }

    /// Write everything, `step(i)` bytes at a time, with at most `iov` slices per call.
    fn write_all(q: &mut SendQueue, iov: usize, step: impl Fn(usize) -> usize) -> (Vec<u8>, usize) {
        let mut out = Vec::new();
        let mut done = 0;
        let mut i = 0;
        while !q.is_empty() {
            let mut slots = vec![IoSlice::new(&[]); iov];
            let n = q.io_slices(&mut slots, true);
            assert!(n > 0);
            let avail: Vec<u8> = slots[..n].iter().flat_map(|s| s.iter().copied()).collect();
            let w = step(i).min(avail.len()).max(1);
            out.extend_from_slice(&avail[..w]);
            done += q.advance(w);
            i += 1;
        }
        (out, done)
    }

    #[test]
    fn a_written_packing_buffer_is_reused_then_released_when_idle() {
        let mut q = SendQueue::new(1 << 20);
        let mut kept: Option<*const u8> = None;
        for round in 0..3u64 {
            for i in 0..100 {
                q.push(&hdr(round * 100 + i), payload(i as usize, 64))
                    .expect("room");
            }
            let ptr = match q.segs.back() {
                Some(Seg::Packed { buf, .. }) => buf.as_ptr(),
                other => panic!("expected a packed segment, got {other:?}"),
            };
            if let Some(k) = kept {
                assert_eq!(
                    ptr, k,
                    "round {round}: the spare buffer is packed into again"
                );
            }
            let total = q.queued_bytes();
            assert_eq!(q.advance(total), 100);
            assert!(q.is_empty());
            kept = q.spare.as_ref().map(|b| b.as_ptr());
            assert!(kept.is_some(), "round {round}: the written buffer is kept");
        }
        assert!(q.release_idle());
        assert!(q.spare.is_none());
        assert!(!q.release_idle());
    }

    #[test]
    fn whole_writes_reproduce_stream() {
        let mut q = SendQueue::new(1 << 20);
        let (stream, _) = fill(&mut q);
        assert_eq!(q.queued_bytes(), stream.len());
        assert_eq!(q.len(), SIZES.len());
        let (out, done) = write_all(&mut q, 64, |_| usize::MAX);
        assert_eq!(out, stream);
        assert_eq!(done, SIZES.len());
        assert_eq!(q.queued_bytes(), 0);
    }

    #[test]
    fn small_frames_are_coalesced() {
        let mut q = SendQueue::new(1 << 20);
        for i in 0..100 {
            q.push(&hdr(i), payload(i as usize, 10)).expect("room");
        }
        let mut slots = vec![IoSlice::new(&[]); 64];
        assert_eq!(q.io_slices(&mut slots, true), 1);
        assert_eq!(slots[0].len(), 100 * (HEADER_LEN + 10));
    }

    #[test]
    fn partial_write_at_every_offset() {
        let mut q = SendQueue::new(1 << 20);
        let (stream, _) = fill(&mut q);
        drop(q);
        for first in 1..stream.len() {
            let mut q = SendQueue::new(1 << 20);
            fill(&mut q);
            let (out, done) = write_all(&mut q, 64, |i| if i == 0 { first } else { usize::MAX });
            assert_eq!(out, stream, "first write {first}");
            assert_eq!(done, SIZES.len());
        }
    }

    #[test]
    fn tiny_writes_and_few_slices() {
        for iov in [1, 2, 3] {
            for step in [1, 7, 40, 41] {
                let mut q = SendQueue::new(1 << 20);
                let (stream, _) = fill(&mut q);
                let (out, done) = write_all(&mut q, iov, |_| step);
                assert_eq!(out, stream, "iov {iov} step {step}");
                assert_eq!(done, SIZES.len());
            }
        }
    }

    #[test]
    fn advance_counts_completed_frames() {
        let mut q = SendQueue::new(1 << 20);
        q.push(&hdr(0), payload(0, 1000)).expect("room");
        q.push(&hdr(1), payload(1, 1000)).expect("room");
        assert_eq!(q.advance(HEADER_LEN + 999), 0);
        assert_eq!(q.advance(1), 1);
        assert_eq!(q.advance(HEADER_LEN + 1000 + 50), 1); // clamped
        assert!(q.is_empty());
    }

    #[test]
    fn bound_is_enforced() {
        let frame = HEADER_LEN + 100;
        let mut q = SendQueue::new(2 * frame);
        q.push(&hdr(0), payload(0, 100)).expect("room");
        q.push(&hdr(1), payload(1, 100)).expect("room");
        let e = q.push(&hdr(2), payload(2, 100)).expect_err("full");
        assert_eq!(
            e,
            QueueFull {
                queued: 2 * frame,
                frame,
                max: 2 * frame
            }
        );
        assert!(e.to_string().contains("full"));
        assert_eq!(q.len(), 2);
        // Writing frees room.
        assert_eq!(q.advance(frame), 1);
        q.push(&hdr(2), payload(2, 100)).expect("room again");
    }

    #[test]
    fn empty_queue_accepts_oversized_frame() {
        let mut q = SendQueue::new(10);
        q.push(&hdr(0), payload(0, 1000))
            .expect("empty queue accepts");
        assert!(q.push(&hdr(1), payload(1, 0)).is_err());
    }

    #[test]
    fn drain_unsent_untouched_queue() {
        let mut q = SendQueue::new(1 << 20);
        let (_, frames) = fill(&mut q);
        assert_eq!(q.drain_unsent(), frames);
        assert!(q.is_empty());
        assert_eq!(q.queued_bytes(), 0);
        let mut slots = vec![IoSlice::new(&[]); 4];
        assert_eq!(q.io_slices(&mut slots, true), 0);
    }

    /// A connection that breaks at any byte: what was handed over as written, what of the
    /// front packing buffer was written, the frame cut off and the frames never started are,
    /// together, every frame once and in order (what a link session keeps and writes again).
    #[test]
    fn a_break_at_every_offset_accounts_for_every_frame_once() {
        for fill_with in [fill, fill_parts] {
            let (stream, frames) = fill_with(&mut SendQueue::new(1 << 20));
            let frames: Vec<_> = frames.iter().map(|(h, p)| (*h, p.to_bytes())).collect();
            for written in 0..=stream.len() {
                for step in [7usize, 100, usize::MAX] {
                    let mut q = SendQueue::new(1 << 20);
                    fill_with(&mut q);
                    let mut got = Vec::new();
                    let mut left = written;
                    while left > 0 {
                        let w = step.min(left);
                        q.advance_with(w, |wr| got.extend(wr.into_frames(0)));
                        left -= w;
                    }
                    if let Some(wr) = q.written_in_front() {
                        got.extend(wr.into_frames(0));
                    }
                    if let Some((h, p, len)) = q.started() {
                        assert_eq!(len, HEADER_LEN + p.len());
                        got.push((h, p));
                    }
                    got.extend(q.drain_unsent());
                    let got: Vec<_> = got.into_iter().map(|(h, p)| (h, p.to_bytes())).collect();
                    assert_eq!(got, frames, "written {written}, step {step}");
                }
            }
        }
    }

    /// A written stretch without its first frames is the rest of it, at every cut.
    #[test]
    fn a_written_stretch_skips_whole_frames() {
        let mut q = SendQueue::new(1 << 20);
        let mut sent = Vec::new();
        for i in 0..50u64 {
            let p = payload(i as usize, (i as usize * 7) % 200);
            let h = Header {
                len: p.len() as u32,
                ..hdr(i)
            };
            q.push(&h, p.clone()).expect("room");
            sent.push((h, p));
        }
        let mut stretches = Vec::new();
        q.advance_with(q.queued_bytes(), |w| stretches.push(w));
        assert_eq!(stretches.len(), 1, "one packing buffer");
        let whole = stretches.pop().expect("one");
        assert_eq!(whole.frames(), 50);
        for skip in 0..=51 {
            let rest = whole.clone().skip(skip);
            let want = &sent[skip.min(50)..];
            match rest {
                None => assert!(want.is_empty(), "skip {skip}"),
                Some(r) => {
                    assert_eq!(r.frames(), want.len());
                    let got: Vec<_> = r
                        .into_frames(0)
                        .into_iter()
                        .map(|(h, p)| (h, p.to_bytes()))
                        .collect();
                    assert_eq!(got, want.to_vec(), "skip {skip}");
                }
            }
        }
    }

    #[test]
    fn drain_unsent_at_every_offset_keeps_partial_frame() {
        let mut q = SendQueue::new(1 << 20);
        let (stream, frames) = fill(&mut q);
        drop(q);
        // Frame boundaries in the stream.
        let mut ends = Vec::new();
        let mut at = 0;
        for (h, _) in &frames {
            at += HEADER_LEN + h.len as usize;
            ends.push(at);
        }
        for written in 0..stream.len() {
            let mut q = SendQueue::new(1 << 20);
            fill(&mut q);
            let done = q.advance(written);
            let complete = ends.iter().filter(|&&e| e <= written).count();
            assert_eq!(done, complete);
            let partial = written > 0 && !ends.contains(&written);
            assert_eq!(q.front_in_progress(), partial);
            let drained = q.drain_unsent();
            let first_unsent = complete + usize::from(partial);
            assert_eq!(
                drained,
                frames[first_unsent..].to_vec(),
                "written {written}"
            );
            // What remains is exactly the rest of the partial frame.
            let end = if partial { ends[complete] } else { written };
            assert_eq!(q.queued_bytes(), end - written);
            let (out, done) = write_all(&mut q, 64, |_| usize::MAX);
            assert_eq!(out, stream[written..end].to_vec());
            assert_eq!(done, usize::from(partial));
            // The queue is usable afterwards.
            q.push(&hdr(99), payload(0, 3)).expect("room");
            let (out, _) = write_all(&mut q, 64, |_| usize::MAX);
            assert_eq!(out.len(), HEADER_LEN + 3);
        }
    }

    #[test]
    fn two_part_frames_reproduce_the_stream_at_every_write_offset() {
        let mut q = SendQueue::new(1 << 20);
        let (stream, frames) = fill_parts(&mut q);
        assert_eq!(q.queued_bytes(), stream.len());
        drop(q);
        for first in (1..stream.len()).step_by(3) {
            for iov in [1, 3, 64] {
                let mut q = SendQueue::new(1 << 20);
                fill_parts(&mut q);
                let (out, done) = write_all(&mut q, iov, |i| if i == 0 { first } else { 997 + i });
                assert_eq!(out, stream, "first write {first}, iov {iov}");
                assert_eq!(done, frames.len());
            }
        }
    }

    #[test]
    fn a_large_body_is_referenced_not_copied() {
        let mut q = SendQueue::new(1 << 20);
        let body = payload(1, 5000);
        q.push(&hdr(0), Payload::two(payload(0, 29), body.clone()))
            .expect("room");
        q.push(&hdr(1), Payload::two(payload(2, 29), body.clone()))
            .expect("room");
        let mut slots = vec![IoSlice::new(&[]); 64];
        let n = q.io_slices(&mut slots, true);
        // Header, head, body, twice (a packing buffer holds whole frames only): the body
        // slices point into `body`.
        assert_eq!(n, 6);
        assert_eq!(slots[0].len(), HEADER_LEN);
        assert_eq!(slots[1].len(), 29);
        for s in [&slots[2], &slots[5]] {
            assert_eq!(s.as_ptr(), body.as_ptr());
            assert_eq!(s.len(), 5000);
        }
    }

    #[test]
    fn drain_unsent_with_two_part_frames_at_every_offset() {
        let mut q = SendQueue::new(1 << 20);
        let (stream, frames) = fill_parts(&mut q);
        drop(q);
        let mut ends = Vec::new();
        let mut at = 0;
        for (h, _) in &frames {
            at += HEADER_LEN + h.len as usize;
            ends.push(at);
        }
        for written in 0..stream.len() {
            let mut q = SendQueue::new(1 << 20);
            fill_parts(&mut q);
            let complete = q.advance(written);
            let partial = written > 0 && !ends.contains(&written);
            let drained = q.drain_unsent();
            assert_eq!(
                drained,
                frames[complete + usize::from(partial)..].to_vec(),
                "written {written}"
            );
            let end = if partial { ends[complete] } else { written };
            let (out, _) = write_all(&mut q, 64, |_| usize::MAX);
            assert_eq!(out, stream[written..end].to_vec(), "written {written}");
        }
    }

    /// A control frame set at any point of a stream of mixed frames goes out whole at the next
    /// frame boundary, the frames around it unchanged and handed over in order; with `data`
    /// false only the control frame is offered.
    #[test]
    fn a_control_frame_goes_at_the_next_frame_boundary() {
        let ctl = Header {
            kind: Kind::Link,
            ..hdr(77)
        }
        .encode();
        let mut reference = SendQueue::new(1 << 20);
        let (stream, frames) = fill(&mut reference);
        let mut ends = vec![0];
        let mut at = 0;
        for (h, _) in &frames {
            at += HEADER_LEN + h.len as usize;
            ends.push(at);
        }
        for written in 0..stream.len() {
            for step in [13usize, 300, usize::MAX] {
                let mut q = SendQueue::new(1 << 20);
                fill(&mut q);
                let mut handed = Vec::new();
                assert_eq!(
                    q.advance_with(written, |w| handed.extend(w.into_frames(0))),
                    ends.iter().filter(|&&e| e > 0 && e <= written).count()
                );
                q.set_control(ctl);
                // While data is held back: the rest of a started frame, else the control.
                let boundary = *ends.iter().find(|&&e| e >= written).expect("an end");
                let mut slots = vec![IoSlice::new(&[]); 64];
                let n = q.io_slices(&mut slots, false);
                let held: Vec<u8> = slots[..n].iter().flat_map(|s| s.iter().copied()).collect();
                if boundary == written {
                    assert_eq!(held, ctl.to_vec(), "written {written}");
                } else {
                    assert_eq!(
                        held,
                        stream[written..boundary].to_vec(),
                        "written {written}"
                    );
                }
                let mut out = Vec::new();
                while !q.is_empty() || q.has_control() {
                    let mut slots = vec![IoSlice::new(&[]); 8];
                    let n = q.io_slices(&mut slots, true);
                    assert!(n > 0);
                    let avail: Vec<u8> =
                        slots[..n].iter().flat_map(|s| s.iter().copied()).collect();
                    let w = step.min(avail.len());
                    out.extend_from_slice(&avail[..w]);
                    q.advance_with(w, |wr| handed.extend(wr.into_frames(0)));
                }
                let mut expect = stream[written..boundary].to_vec();
                expect.extend_from_slice(&ctl);
                expect.extend_from_slice(&stream[boundary..]);
                assert_eq!(out, expect, "written {written}, step {step}");
                // Every frame, each once, in order (a packing buffer once all of it is
                // written).
                let handed: Vec<_> = handed.into_iter().map(|(h, p)| (h, p.to_bytes())).collect();
                let frames: Vec<_> = frames.iter().map(|(h, p)| (*h, p.to_bytes())).collect();
                assert_eq!(handed, frames, "written {written}");
            }
        }
    }
}
