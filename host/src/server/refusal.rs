//! hyper's own refusals of a request head it cannot read (larger than
//! `max_header_bytes`, a malformed request line or header, a URI too long),
//! made into the JSON error envelope with `X-Request-Id` that every other
//! refusal is.
//!
//! hyper answers these itself, before any service runs, with a bare status
//! line, and offers no hook to change it. So an HTTP/1 connection's IO is
//! wrapped: a response head hyper writes with status 400, 414 or 431 and
//! neither `X-Request-Id` nor `Content-Type` (every answer of ours has
//! both) is replaced, as it is written, by the envelope of the matching
//! catalogue error. hyper closes the connection after such an answer, so
//! whatever it writes afterwards is dropped. Other writes pass through
//! untouched, after a look at their first bytes.
//!
//! A refused head is often not read whole, and closing a socket with unread
//! bytes resets it, which can destroy the answer before the client reads
//! it; so after a refusal the connection lingers (write side closed, what
//! arrives read and dropped) for at most a second and 1 MiB.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// How long a refused connection is drained before it is closed.
const LINGER: Duration = Duration::from_secs(1);
/// How much of a refused connection is drained at most.
const LINGER_BYTES: usize = 1 << 20;

use super::{request_id, response};
use crate::error::ApiError;

/// An HTTP/1 connection's IO, with hyper's bare refusals replaced.
pub struct Refusals<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> {
    io: Option<T>,
    /// Our answer in place of hyper's, and how much of it is written.
    replaced: Option<(Vec<u8>, usize)>,
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Refusals<T> {
    pub fn new(io: T) -> Refusals<T> {
        Refusals {
            io: Some(io),
            replaced: None,
        }
    }

    fn io(&mut self) -> Pin<&mut T> {
        // Taken only in `drop`.
        Pin::new(self.io.as_mut().expect("the IO is here until dropped"))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Drop for Refusals<T> {
    fn drop(&mut self) {
        let (Some(mut io), Some(_)) = (self.io.take(), &self.replaced) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let _ = io.shutdown().await;
            let drain = async {
                let (mut buf, mut drained) = (vec![0u8; 8192], 0);
                while drained < LINGER_BYTES {
                    match io.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => drained += n,
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER, drain).await;
        });
    }
}

/// The envelope to write instead of `written`, when it is a refusal hyper
/// made itself.
fn replacement(written: &[u8]) -> Option<Vec<u8>> {
    let rest = written
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| written.strip_prefix(b"HTTP/1.0 "))?;
    let status = std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()?;
    let error = ApiError::of_unparsed_head(status)?;
    let end = written.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = written[..end].to_ascii_lowercase();
    let has = |name: &[u8]| head.windows(name.len()).any(|w| w == name);
    if has(b"\nx-request-id:") || has(b"\ncontent-type:") {
        return None;
    }
    let id = request_id::accept_or_generate(None);
    tracing::info!(id = %id, status, code = error.code(), "request head refused");
    let body = response::error_json(&error, &id);
    let status = error.status();
    // `Date`: an origin server with a clock sends it (RFC 9110, 6.6.1).
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ndate: {}\r\ncontent-type: application/json\r\n\
         cache-control: no-store\r\nx-content-type-options: {}\r\n\
         content-security-policy: {}\r\nx-request-id: {id}\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        httpdate::fmt_http_date(std::time::SystemTime::now()),
        response::NOSNIFF,
        response::NO_CONTENT_ALLOWED,
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    Some(answer)
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Refusals<T> {
    /// Writes what is left of the replacement, if any.
    fn poll_replaced(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some((answer, written)) = &mut self.replaced else {
            return Poll::Ready(Ok(()));
        };
        let Some(io) = self.io.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        while *written < answer.len() {
            match Pin::new(&mut *io).poll_write(cx, &answer[*written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *written += n,
                other => return other.map(|r| r.map(|_| ())),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `written` in place of hyper's refusal; `true` when it was one,
    /// or when one was already taken (hyper writes nothing that counts
    /// after it).
    fn replace(&mut self, cx: &mut Context<'_>, written: &[u8]) -> bool {
        if self.replaced.is_none() {
            match replacement(written) {
                Some(answer) => self.replaced = Some((answer, 0)),
                None => return false,
            }
        }
        // Progress now if the socket takes it; flush finishes it.
        let _ = self.poll_replaced(cx);
        true
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncRead for Refusals<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.io().poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncWrite for Refusals<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.replace(cx, buf) {
            return Poll::Ready(Ok(buf.len()));
        }
        self.io().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper writes a head in one slice, before any body.
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
        if self.replace(cx, first) {
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        self.io().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_replaced(cx))?;
        self.io().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_replaced(cx))?;
        self.io().poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_bare_refusals_are_replaced() {
        let bare =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let answer = String::from_utf8(replacement(bare).expect("replaced")).unwrap();
        let date = answer
            .split("\r\ndate: ")
            .nth(1)
            .expect("a Date")
            .split("\r\n");
        let date = date.into_iter().next().unwrap();
        assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        assert!(answer.contains(&format!("content-length: {}\r\n", body.len())));
        for ours in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nx-request-id: a\r\n\r\n{}"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"{\"success\":false}",
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
        ] {
            assert!(replacement(ours).is_none(), "{}", String::from_utf8_lossy(ours));
        }
    }
}
