//! One Postgres connection that `LISTEN`s on a channel, and proves it is
//! still connected without starting a transaction.
//!
//! Diesel's connection can listen but can only prove it is alive with a
//! statement, and every statement is a transaction: four a second per
//! process for a check that changes nothing. Here the proof is the
//! protocol's own round trip: a `Sync` message with nothing before it,
//! which the server answers `ReadyForQuery` without starting a transaction
//! (libpq sends one as a pipeline's sync point). The connection is libpq's,
//! as under Diesel; only this file touches it, and it is never shared.

use std::ffi::{c_char, CStr, CString};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

use pq_sys::{
    ConnStatusType, ExecStatusType, PGconn, PQclear, PQconnectdbParams, PQconsumeInput,
    PQenterPipelineMode, PQerrorMessage, PQexec, PQfinish, PQflush, PQfreemem, PQgetResult,
    PQisBusy, PQnotifies, PQpipelineSync, PQresultStatus, PQsetnonblocking, PQsocket, PQstatus,
};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::Instant;

use crate::error::AppError;

/// A libpq connection, owned here alone.
struct Conn(NonNull<PGconn>);

// libpq lets a connection move between threads as long as one thread at a
// time uses it; `Listener` takes `&mut self` for every call.
unsafe impl Send for Conn {}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: the pointer came from PQconnectdbParams and is finished once.
        unsafe { PQfinish(self.0.as_ptr()) }
    }
}

impl Conn {
    fn ptr(&self) -> *mut PGconn {
        self.0.as_ptr()
    }

    fn error(&self, what: &str) -> AppError {
        // SAFETY: libpq returns a NUL-terminated string owned by the connection.
        let message = unsafe { CStr::from_ptr(PQerrorMessage(self.ptr())) };
        AppError::Unavailable(format!("{what}: {}", message.to_string_lossy().trim_end()))
    }
}

pub struct Listener {
    /// A duplicate of libpq's socket, so the runtime's registration never
    /// outlives the socket it watches: libpq closes its own copy when the
    /// server goes away, and the number may then be reused.
    socket: AsyncFd<OwnedFd>,
    conn: Conn,
}

impl Listener {
    /// Connects to `url` and listens on `channel` (a plain identifier).
    pub async fn listen(
        url: &str,
        channel: &'static str,
        connect_timeout: Duration,
    ) -> Result<Listener, AppError> {
        // Its reconnecting thread is the one most likely to be inside libpq
        // as the process ends: see `db::without_gss_probe`.
        let url = CString::new(super::without_gss_probe(url))
            .map_err(|_| AppError::Internal(anyhow::anyhow!("DATABASE_URL contains NUL")))?;
        let timeout =
            CString::new(connect_timeout.as_secs().max(1).to_string()).expect("digits have no NUL");
        let conn = tokio::task::spawn_blocking(move || connect(&url, &timeout, channel))
            .await
            .map_err(|e| AppError::Internal(anyhow::anyhow!("listener connect task: {e}")))??;
        // SAFETY: the socket stays open while `conn` lives, and it is only
        // borrowed here to duplicate it.
        let socket = unsafe { BorrowedFd::borrow_raw(PQsocket(conn.ptr())) }
            .try_clone_to_owned()
            .map_err(|e| AppError::Unavailable(format!("listener socket: {e}")))?;
        // SAFETY: the duplicate is owned by the AsyncFd and open until it drops.
        let socket = unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE) }
            .map_err(|e| AppError::Unavailable(format!("listener socket: {e}")))?;
        Ok(Listener { socket, conn })
    }

    /// A round trip to the server that starts no transaction; the payloads
    /// of the notifications that arrived before its answer. When it returns,
    /// every notification committed before it was sent has been read, or
    /// is on its way in the same instant (the server sends them as soon as
    /// it is idle between messages).
    pub async fn round_trip(&mut self, within: Duration) -> Result<Vec<String>, AppError> {
        let deadline = Instant::now() + within;
        // SAFETY: a live connection in pipeline mode.
        if unsafe { PQpipelineSync(self.conn.ptr()) } != 1 {
            return Err(self.conn.error("listener sync"));
        }
        let mut payloads = Vec::new();
        loop {
            // SAFETY: as above; 1 means some of the message is still unsent.
            match unsafe { PQflush(self.conn.ptr()) } {
                0 => break,
                1 if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(1)).await
                }
                _ => return Err(self.conn.error("listener flush")),
            }
        }
        while !self.read(&mut payloads)? {
            if !self.readable_until(deadline).await? {
                return Err(AppError::Unavailable(
                    "listener: no answer to a round trip in time".into(),
                ));
            }
        }
        Ok(payloads)
    }

    /// Waits until notifications arrive or `deadline` passes; their payloads.
    pub async fn notifications(&mut self, deadline: Instant) -> Result<Vec<String>, AppError> {
        let mut payloads = Vec::new();
        loop {
            self.read(&mut payloads)?;
            if !payloads.is_empty() || Instant::now() >= deadline {
                return Ok(payloads);
            }
            if !self.readable_until(deadline).await? {
                return Ok(payloads);
            }
        }
    }

    /// Until the socket may have something to read (true), or `deadline`. The
    /// readiness is cleared only after libpq has read what was there; a
    /// short cap on each wait means data libpq left unread (it reads in
    /// buffer-sized pieces) is never stranded behind a cleared edge.
    async fn readable_until(&mut self, deadline: Instant) -> Result<bool, AppError> {
        let cap = (Instant::now() + Duration::from_millis(50)).min(deadline);
        match tokio::time::timeout_at(cap, self.socket.readable_mut()).await {
            Ok(Ok(mut ready)) => {
                ready.clear_ready();
                Ok(true)
            }
            Ok(Err(e)) => Err(AppError::Unavailable(format!("listener socket: {e}"))),
            Err(_) => Ok(Instant::now() < deadline),
        }
    }

    /// Reads what the server sent: notifications go to `payloads`; whether
    /// the answer to a round trip came.
    fn read(&mut self, payloads: &mut Vec<String>) -> Result<bool, AppError> {
        let conn = self.conn.ptr();
        // SAFETY: a live connection; every result and notification libpq
        // hands out is freed here, once.
        unsafe {
            if PQconsumeInput(conn) == 0 {
                return Err(self.conn.error("listener read"));
            }
            let mut synced = false;
            while PQisBusy(conn) == 0 {
                let result = PQgetResult(conn);
                if result.is_null() {
                    break;
                }
                let status = PQresultStatus(result);
                PQclear(result);
                match status {
                    ExecStatusType::PGRES_PIPELINE_SYNC => synced = true,
                    ExecStatusType::PGRES_FATAL_ERROR => {
                        return Err(self.conn.error("listener connection"))
                    }
                    _ => {}
                }
            }
            loop {
                let notification = PQnotifies(conn);
                if notification.is_null() {
                    break;
                }
                let payload = CStr::from_ptr((*notification).extra as *const c_char);
                payloads.push(payload.to_string_lossy().into_owned());
                PQfreemem(notification.cast());
            }
            if PQstatus(conn) != ConnStatusType::CONNECTION_OK {
                return Err(self.conn.error("listener connection"));
            }
            Ok(synced)
        }
    }
}

/// Blocking: connects, listens, and leaves the connection non-blocking in
/// pipeline mode (where a lone `Sync` can be sent).
fn connect(url: &CStr, timeout: &CStr, channel: &str) -> Result<Conn, AppError> {
    let keywords = [
        c"dbname".as_ptr(),
        c"connect_timeout".as_ptr(),
        c"application_name".as_ptr(),
        std::ptr::null(),
    ];
    let values = [
        url.as_ptr(),
        timeout.as_ptr(),
        c"flashsale revocation listener".as_ptr(),
        std::ptr::null(),
    ];
    let listen = CString::new(format!("LISTEN {channel}"))
        .map_err(|_| AppError::Internal(anyhow::anyhow!("channel name contains NUL")))?;
    // SAFETY: both arrays are NULL-terminated and outlive the call;
    // expand_dbname = 1 reads `dbname` as the URL, as Diesel does.
    let conn = unsafe { PQconnectdbParams(keywords.as_ptr(), values.as_ptr(), 1) };
    let conn = Conn(NonNull::new(conn).ok_or_else(|| {
        AppError::Unavailable("listener: libpq could not allocate a connection".into())
    })?);
    // SAFETY: a connection object from libpq, live until `conn` drops.
    unsafe {
        if PQstatus(conn.ptr()) != ConnStatusType::CONNECTION_OK {
            return Err(conn.error("listener connect"));
        }
        let result = PQexec(conn.ptr(), listen.as_ptr());
        let listening =
            !result.is_null() && PQresultStatus(result) == ExecStatusType::PGRES_COMMAND_OK;
        PQclear(result);
        if !listening {
            return Err(conn.error("LISTEN"));
        }
        if PQsetnonblocking(conn.ptr(), 1) != 0 || PQenterPipelineMode(conn.ptr()) != 1 {
            return Err(conn.error("listener pipeline mode"));
        }
    }
    Ok(conn)
}
