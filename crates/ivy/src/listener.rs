//! The HTTP port's listener, closed without dropping a request that reached it.
//!
//! Two ways a request already sent is lost when a server closes, both closed here:
//! - the kernel completes handshakes before the server accepts them, and closing the socket
//!   resets every connection still in its queue: on close this listener takes that queue first;
//! - hyper's graceful shutdown closes a connection it has read nothing from yet, even with the
//!   request waiting in the socket: [`ClosingListener::closed`] waits for every connection's
//!   first read, and the server starts that shutdown only then.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long a connection accepted before the close may stay silent before the server shuts
/// down without waiting for its request: a client sends its request right after connecting.
const FIRST_READ_PATIENCE: Duration = Duration::from_secs(1);

/// A TCP listener for `axum::serve` that closes when `closing` resolves; see the module doc.
pub struct ClosingListener {
    state: State,
    addr: SocketAddr,
    closing: Pin<Box<dyn Future<Output = ()> + Send>>,
    closed: watch::Sender<bool>,
    /// How many connections handed out have not completed a read yet.
    unread: Arc<watch::Sender<usize>>,
}

enum State {
    Open(TcpListener),
    /// The socket is closed; these connections, taken from the kernel's queue, are still to serve.
    Closed(VecDeque<(TcpStream, SocketAddr)>),
}

impl ClosingListener {
    /// Listens on `listener` until `closing` resolves.
    pub fn new(listener: TcpListener, closing: impl Future<Output = ()> + Send + 'static) -> Self {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| ([0, 0, 0, 0], 0).into());
        Self {
            state: State::Open(listener),
            addr,
            closing: Box::pin(closing),
            closed: watch::Sender::new(false),
            unread: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Resolves once the socket is closed, every connection it held is handed out, and each has
    /// read its first bytes (or [`FIRST_READ_PATIENCE`] passed): the moment for the server's
    /// graceful shutdown. Never resolves if the listener is dropped open.
    pub fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut closed = self.closed.subscribe();
        let mut unread = self.unread.subscribe();
        async move {
            if closed.wait_for(|&closed| closed).await.is_err() {
                std::future::pending::<()>().await;
            }
            let all_read = unread.wait_for(|&unread| unread == 0);
            let _ = tokio::time::timeout(FIRST_READ_PATIENCE, all_read).await;
        }
    }

    fn close(&mut self) {
        let queued = match std::mem::replace(&mut self.state, State::Closed(VecDeque::new())) {
            State::Open(listener) => match listener.into_std() {
                Ok(listener) => take_queue(&listener),
                Err(err) => {
                    tracing::warn!("cannot take the queued connections before closing: {err}");
                    VecDeque::new()
                }
            },
            State::Closed(queued) => queued,
        };
        tracing::info!(
            "new connections refused; {} queued ones served",
            queued.len()
        );
        self.state = State::Closed(queued);
    }

    fn hand_out(&self, (stream, addr): (TcpStream, SocketAddr)) -> (Connection, SocketAddr) {
        // Without TCP_NODELAY a response written in two parts can wait for the client's delayed ACK.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY on a connection: {err}");
        }
        self.unread.send_modify(|unread| *unread += 1);
        let unread = Some(Unread(self.unread.clone()));
        (Connection { stream, unread }, addr)
    }
}

/// Accepts, without waiting, every connection `listener` holds (the socket closes when it drops).
fn take_queue(listener: &std::net::TcpListener) -> VecDeque<(TcpStream, SocketAddr)> {
    let mut queue = VecDeque::new();
    loop {
        match listener.accept() {
            Ok((stream, addr)) => {
                match stream
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(stream))
                {
                    Ok(stream) => queue.push_back((stream, addr)),
                    Err(err) => tracing::debug!("dropping a queued connection from {addr}: {err}"),
                }
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => return queue,
            Err(err) if err.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(err) => {
                tracing::warn!("cannot take the queued connections before closing: {err}");
                return queue;
            }
        }
    }
}

impl axum::serve::Listener for ClosingListener {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        loop {
            let accepted = match &mut self.state {
                State::Open(listener) => tokio::select! {
                    biased;
                    () = &mut self.closing => {
                        self.close();
                        continue;
                    }
                    accepted = axum::serve::Listener::accept(listener) => accepted,
                },
                State::Closed(queue) => match queue.pop_front() {
                    Some(accepted) => accepted,
                    None => {
                        self.closed.send_replace(true);
                        return std::future::pending().await;
                    }
                },
            };
            return self.hand_out(accepted);
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// An accepted connection; it counts as unread (see [`ClosingListener::closed`]) until a read
/// completes or it drops.
pub struct Connection {
    stream: TcpStream,
    unread: Option<Unread>,
}

struct Unread(Arc<watch::Sender<usize>>);

impl Drop for Unread {
    fn drop(&mut self) {
        self.0.send_modify(|unread| *unread -= 1);
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if read.is_ready() {
            self.unread = None;
        }
        read
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener;
    use futures::FutureExt;
    use std::io::{Read, Write};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::timeout;

    #[tokio::test]
    async fn queued_connections_are_served_and_later_ones_refused() {
        let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let (close, closing) = tokio::sync::oneshot::channel::<()>();
        let mut listener = ClosingListener::new(socket, async move {
            let _ = closing.await;
        });
        // Handshakes the kernel completes while nobody accepts: they wait in its queue.
        let mut clients: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        for client in &mut clients {
            client.write_all(b"hi").unwrap();
        }
        close.send(()).unwrap();

        let mut served = Vec::new();
        for _ in &clients {
            let (connection, _) = timeout(Duration::from_secs(5), listener.accept())
                .await
                .unwrap();
            served.push(connection);
        }
        let refused = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        assert!(timeout(Duration::from_millis(100), listener.accept())
            .await
            .is_err());

        // Closed and handed out, but nothing read yet: a graceful shutdown now would lose them.
        assert!(listener.closed().now_or_never().is_none());
        for (connection, client) in served.iter_mut().zip(&mut clients) {
            let mut request = [0; 2];
            connection.read_exact(&mut request).await.unwrap();
            connection.write_all(b"ok").await.unwrap();
            client.read_exact(&mut request).unwrap();
            assert_eq!(&request, b"ok");
        }
        assert!(listener.closed().now_or_never().is_some());
    }
}
