//! Socket writes that never raise `SIGPIPE`: every socket the library writes goes through here.
//!
//! Why: `write` or `writev` to a socket whose peer closed it (a Unix-domain socket at once, a
//! TCP one after the peer's reset) raises `SIGPIPE`, whose default action ends the process. A
//! Rust program ignores it (its runtime does at start); a C program linking `libtbon` does
//! not. Found by a probe: a local process that connected to a C daemon's client socket and
//! closed at once killed the daemon (exit 141), since the daemon's refusal was written to a
//! closed socket. `std`'s `TcpStream::write` sends with `MSG_NOSIGNAL`, but its
//! `write_vectored` (`writev`) and every `UnixStream` write do not. Here the same writes are
//! `send`/`sendmsg` with `MSG_NOSIGNAL`: a closed peer is `BrokenPipe`, and nothing else
//! changes (no process-wide signal setting is touched).

use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// `writev` to the socket `fd` without `SIGPIPE` (`sendmsg` with `MSG_NOSIGNAL`). The errors
/// are `writev`'s (`WouldBlock` on a full non-blocking socket, `BrokenPipe` on a closed peer).
pub(crate) fn send_vectored(fd: &impl AsRawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    nix::sys::socket::sendmsg::<()>(
        fd.as_raw_fd(),
        bufs,
        &[],
        nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io::Error::from)
}

/// A `UnixStream` written with `send(MSG_NOSIGNAL)`: a closed peer is `BrokenPipe`, no signal.
#[derive(Debug)]
pub(crate) struct SocketWriter(pub UnixStream);

impl Write for SocketWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        nix::sys::socket::send(
            self.0.as_raw_fd(),
            buf,
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
        )
        .map_err(io::Error::from)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_a_closed_peer_is_broken_pipe() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut w = SocketWriter(a);
        w.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        io::Read::read_exact(&mut b, &mut got).unwrap();
        assert_eq!(&got, b"ping");
        drop(b);
        let e = w.write_all(b"after the close").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn sends_vectored_and_a_closed_peer_is_broken_pipe() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let n = send_vectored(&a, &[IoSlice::new(b"pi"), IoSlice::new(b"ng")]).unwrap();
        assert_eq!(n, 4);
        let mut got = [0u8; 4];
        io::Read::read_exact(&mut b, &mut got).unwrap();
        assert_eq!(&got, b"ping");
        drop(b);
        let e = send_vectored(&a, &[IoSlice::new(b"x")]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
