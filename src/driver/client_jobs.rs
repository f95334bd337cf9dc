//! Jobs whose client processes connect to this daemon (issue "Jobs"; see [`crate::clients`]):
//! `Handle::client_job` and `Handle::client_job_close`.
use super::caddy::Caddy;
use super::handle::Handle;
use crate::clients::{ClientCredential, ClientError, JobId};
use crate::error::SendError;

impl Handle {
    /// Opens `job` for client processes on this daemon and returns the credential to give
    /// them (for example [`ClientCredential::env`] in the environment of the processes the
    /// embedder starts). Their messages may reach only clients of `job`, and clients of the
    /// jobs listed in `accept_from` may message them (on their own daemons each receiver's
    /// job decides). Opening a job again makes a new key (clients admitted stay) and replaces
    /// the list.
    ///
    /// Errors: [`ClientError::NoSocket`] (the `client_socket` setting is unset), `TooLarge`
    /// (`accept_from` lists more than `limits::CLIENT_ACCEPT_FROM_MAX` jobs: `len` jobs,
    /// `max` the bound),
    /// `Busy` (`limits::CLIENT_JOBS_MAX` jobs open, closed ones with clients left included;
    /// or a call from a callback on the daemon's loop thread, which cannot wait for the loop's
    /// answer), `DaemonLost` (the daemon stopped).
    pub fn client_job(
        &self,
        job: JobId,
        accept_from: &[JobId],
    ) -> Result<ClientCredential, ClientError> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| ClientError::Io(format!("random key: {e}")))?;
        self.client_job_with_key(job, key, accept_from)
    }

    /// [`Handle::client_job`] with a key the embedder chose: a resource manager that starts a
    /// job's processes on many nodes gives every daemon of the job the same key, so one
    /// environment serves every process. Make it with 32 bytes from a cryptographic random
    /// source (`tbon keygen FILE` writes 64 hexadecimal digits; `clients::parse_key` reads
    /// them).
    pub fn client_job_with_key(
        &self,
        job: JobId,
        key: [u8; 32],
        accept_from: &[JobId],
    ) -> Result<ClientCredential, ClientError> {
        let Some(socket) = self.shared.client_socket.clone() else {
            return Err(ClientError::NoSocket);
        };
        if accept_from.len() > crate::limits::CLIENT_ACCEPT_FROM_MAX {
            return Err(ClientError::TooLarge {
                len: accept_from.len(),
                max: crate::limits::CLIENT_ACCEPT_FROM_MAX,
            });
        }
        if self.shared.on_loop_thread() {
            return Err(ClientError::Busy);
        }
        let accept_from = accept_from.to_vec();
        self.ask(|reply| Caddy::ClientJob {
            job,
            key,
            accept_from,
            reply,
        })
        .map_err(command_error)?;
        Ok(ClientCredential { socket, job, key })
    }

    /// `job` is over on this daemon (its processes were killed, say): no new client is
    /// admitted, and every client of the job connected here is disconnected (told why, as
    /// far as its socket takes it: `Client::daemon_lost` says "job J ended"); whoever watches
    /// them is told `Exited`. Ending a job this daemon never opened, or ended already, is `Ok`
    /// and does nothing (a resource manager may end a job everywhere without asking where it
    /// ran).
    ///
    /// Errors: `DaemonLost` (the daemon stopped), `Busy` (from a callback, with the daemon's
    /// command queue full).
    pub fn client_job_end(&self, job: JobId) -> Result<(), ClientError> {
        self.shared
            .submit(Caddy::ClientJobEnd { job })
            .map_err(command_error)
    }

    /// This daemon's client socket (the `client_socket` setting), if it has one.
    pub fn client_socket(&self) -> Option<&std::path::Path> {
        self.shared.client_socket.as_deref()
    }

    /// No new client of `job` is admitted here; clients connected stay until they exit, and
    /// the job's `accept_from` still decides what reaches them. Closing a job that is not open
    /// here is `Ok` and does nothing, as ending one is.
    ///
    /// Errors as [`Handle::client_job_end`]'s.
    pub fn client_job_close(&self, job: JobId) -> Result<(), ClientError> {
        self.shared
            .submit(Caddy::ClientJobClose { job })
            .map_err(command_error)
    }
}

/// A refused command to the daemon's loop, as a client-job call reports it.
fn command_error(e: SendError) -> ClientError {
    match e {
        SendError::Busy(_) => ClientError::Busy,
        _ => ClientError::DaemonLost,
    }
}
