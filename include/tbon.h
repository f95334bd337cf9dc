/*
 * tbon.h: the C API of tbon, a fault-tolerant tree-based overlay network for the daemons of an
 * HPC resource manager. Build and link: README.md, "Using tbon from C" (pkg-config: tbon.pc).
 *
 * OVERVIEW
 *   tbon_config_new / tbon_config_set / tbon_config_free   settings by name (as TBON_<NAME>)
 *   tbon_start -> tbon_daemon; tbon_contact_uri (rank 0's is what the others join with)
 *   tbon_wait_wired, tbon_send, tbon_send_nocopy, tbon_send_batch, tbon_send_routed (asks for a
 *   direct link to the destination, see README "Direct links"), tbon_send_reliable,
 *   tbon_broadcast, tbon_recv, tbon_cancel, tbon_recv_blocking
 *   tbon_allgather, tbon_barrier (collectives, each with a caller-chosen id never reused)
 *   groups (one job's daemons): tbon_group_new (a context and the member ranks; one group per
 *   daemon), then tbon_group_allgather, tbon_group_barrier, tbon_group_broadcast in the same
 *   order at every member (a group numbers its collectives itself), tbon_group_free
 *   data exchange (a job's keys and values, PMI's modex; over a tbon_group): tbon_put, then
 *   tbon_commit, then tbon_fence (TBON_FENCE_FULL: every member's data to every member;
 *   TBON_FENCE_DIRECT: only synchronise, fetch on first get) or tbon_fence_cb, then tbon_get
 *   (into the caller's buffer) or tbon_get_cb; tbon_forget_group when the job is over
 *   tbon_on_fault (or tbon_on_repair: also rejoins, joins and departures), tbon_counters_get,
 *   tbon_rank, tbon_size
 *   streams (README "Streams"): tbon_serve (a service; its callback writes with
 *   tbon_writer_write or tbon_writer_write_nocopy and ends with tbon_writer_finish /
 *   tbon_writer_fail), tbon_fetch then
 *   tbon_stream_read until 0 bytes (finished) or an error, tbon_stream_close; tbon_fetch_cb
 *   for a callback per chunk, tbon_fetch_cancel
 *   clients (application processes routed through their daemon; README "Clients"): the daemon
 *   (its client_socket set) opens a job with tbon_client_job (a key; tbon_client_socket_path
 *   gives the socket) and hands both to the job's processes; a process connects with
 *   tbon_client_connect or tbon_client_from_env -> tbon_client (a name: rank, local id), then
 *   tbon_client_send / tbon_client_try_send / tbon_client_send_wait to another client by name,
 *   tbon_client_recv (into the caller's buffer) or tbon_client_recv_cb, tbon_client_watch,
 *   tbon_client_close; tbon_client_job_close stops admitting a job's processes
 *   tbon_shutdown / tbon_shutdown_dvm (rank 0: stop the whole DVM) / tbon_abort, then tbon_free
 *
 * RESULTS. Every call returns a tbon_rc (TBON_OK is 0). tbon_strerror(rc) describes a code;
 * tbon_last_error() gives the detail of the last failure on the calling thread.
 *
 * HANDLES are 64-bit ids, never reused; 0 is never valid. A freed or unknown handle gives
 * TBON_ERR_BAD_HANDLE, never a crash. NULL where a pointer is required gives TBON_ERR_BAD_PARAM.
 * No Rust panic crosses this boundary (it would become TBON_ERR_INTERNAL).
 * SIGNALS: tbon changes no signal setting of the process and never raises SIGPIPE (its socket
 * writes send with MSG_NOSIGNAL): a peer or client that closes its connection cannot kill it.
 *
 * THREADS. Every function may be called from any thread, concurrently. Each daemon runs its own
 * loop thread; several daemons may live in one process.
 *
 * CALLBACKS (send completions, receive callbacks, fault handlers, collectives' results, gets'
 * answers, stream callbacks) run on the daemon's loop thread (a stream service's callback is the exception: it
 * runs on a thread of its own per stream and may block; a client's callbacks run on that
 * client's own thread, one at a time, and may call tbon_client_send, tbon_client_try_send,
 * tbon_client_recv_cb, tbon_client_cancel, tbon_client_watch and tbon_client_close, a send
 * getting TBON_ERR_BUSY rather than waiting for room). Keep them short. Inside a callback
 * you may call tbon_send, tbon_send_nocopy,
 * tbon_send_batch, tbon_send_routed, tbon_send_reliable,
 * tbon_broadcast, tbon_allgather, tbon_group_allgather, tbon_group_broadcast, tbon_group_new,
 * tbon_group_next_seq, tbon_group_free, tbon_put, tbon_commit, tbon_forget_group,
 * tbon_fence_cb, tbon_get_cb, tbon_recv, tbon_cancel, tbon_purge, tbon_rank, tbon_size, tbon_contact_uri,
 * tbon_fetch, tbon_fetch_cb, tbon_fetch_cancel, tbon_stream_close, tbon_client_socket_path,
 * tbon_client_job_close, the client calls that do not wait (above),
 * tbon_strerror and tbon_last_error. The blocking calls (tbon_recv_blocking, tbon_barrier, tbon_group_barrier, tbon_fence,
 * tbon_get, tbon_wait_wired, tbon_wait_stopped,
 * tbon_counters_get, tbon_start, tbon_shutdown, tbon_shutdown_dvm, tbon_abort, tbon_free,
 * tbon_stream_read, tbon_writer_write, tbon_status_get, tbon_status_query, tbon_client_job,
 * tbon_client_job_with_key, tbon_client_connect, tbon_client_from_env, tbon_client_recv,
 * tbon_client_send_wait) return
 * TBON_ERR_BUSY there instead of deadlocking. A send from a callback gets TBON_ERR_BUSY if the
 * command queue is full (from other threads it blocks until there is room: back-pressure).
 * The `void *user` pointers are handed back untouched, on the loop thread: what they point to
 * must be usable from that thread and stay alive while the callback can still run. A send
 * completion and a one-shot receive run at most once. After tbon_cancel returns, a receive
 * callback may still run for a message the loop matched before it handled the cancel. After
 * tbon_shutdown, tbon_shutdown_dvm, tbon_abort or tbon_free has returned, no callback of that
 * daemon runs any more: the safe point to free `user` data. tbon_stop_reason, tbon_rank and
 * tbon_size never block. A log callback (tbon_log_callback) runs on whichever thread logs.
 *
 * FORK. A daemon's loop thread does not exist in a child made by fork(): a child must not use
 * a daemon its parent started (not even tbon_free). In a child, the parent's daemon, client,
 * stream, writer and status handles are TBON_ERR_BAD_HANDLE (tbon forgets them there, without
 * freeing: their threads are not in the child); configurations stay usable, and so do groups
 * not yet used with a daemon (a group is bound to the first daemon it is used with: one the
 * parent used is bound to a daemon the child does not have, and its calls fail; make the
 * child's own with tbon_group_new). Fork before tbon_start, or exec in the child (the sockets
 * are close-on-exec). A child may start daemons of its own.
 *
 * MEMORY. tbon never keeps a caller pointer past a call except `user` (and the lent buffer of
 * tbon_send_nocopy). Payloads are COPIED by tbon_send / tbon_send_reliable / tbon_broadcast
 * (and tbon_send_batch) before they return (the caller keeps ownership). tbon_send_nocopy lends the buffer instead
 * and gets a free callback. Received data is valid only during the receive callback;
 * tbon_recv_blocking, tbon_get and tbon_client_recv copy into the caller's buffer; tbon_put
 * copies the value; the tbon_client_*send calls copy the payload.
 *
 * MESSAGES. Tags below TBON_TAG_USER_MIN (100) are reserved. Plain sends (tbon_send,
 * tbon_send_nocopy, tbon_send_batch for many small messages at once) are not acknowledged end to end: a completion with TBON_OK means handed to
 * the kernel on the first hop, and a plain message can be lost when a daemon on its path dies.
 * tbon_send_reliable is acknowledged end to end: each message reaches its destination once, in
 * order with the sender's other reliable messages to it, across the deaths of daemons on its
 * path; its completion says TBON_OK once the destination posted it, TBON_ERR_NODE_DOWN if the
 * destination died first. tbon_broadcast is the fault-tolerant broadcast: every living daemon
 * delivers every broadcast once, all in the same order; its completion says TBON_OK once all
 * have it. Details: README.md, "What survives what".
 */


#ifndef TBON_H
#define TBON_H

/* Generated by cbindgen from capi/src/lib.rs; do not edit. Regenerate: TBON_BLESS=1 cargo test --release --test c_header */

#include <stddef.h>
#include <stdint.h>

// The wildcard peer of `tbon_recv`/`tbon_recv_blocking`/`tbon_cancel`: any origin.
#define TBON_RANK_ANY 4294967295

// "No rank", e.g. `tbon_counters.parent` on rank 0.
#define TBON_RANK_NONE 4294967295

// The lowest user tag; tags below it are reserved for the runtime.
#define TBON_TAG_USER_MIN 100

// Messages `tbon_send_batch` hands to the loop at once (a longer array is sent in groups).
#define TBON_SEND_BATCH_MAX 1024

// `tbon_send_routed`: do not ask for a direct link because of this send.
#define TBON_ROUTE_TREE 0

// `tbon_send_routed`: ask the destination for a direct link if none is open or asked for
// (unless a recent denial is cached).
#define TBON_ROUTE_DIRECT 1

// `tbon_client_recv`/`tbon_client_recv_cb`: as both `from_rank` and `from_local`, a message
// from any client (one of them alone is `TBON_ERR_BAD_PARAM`).
#define TBON_CLIENT_ANY 4294967295

// `tbon_client_recv`/`tbon_client_recv_cb`: as `tag`, a message with any tag (a message
// sent with tag 0xFFFFFFFF is then received only this way).
#define TBON_TAG_ANY 4294967295

// The size of the buffer `tbon_client_job` writes the job's client key into: 64 hexadecimal
// digits and a NUL.
#define TBON_CLIENT_KEY_HEX_SIZE 65

// Sends of one client unanswered at once: `tbon_client_send` then waits for a result,
// `tbon_client_try_send` returns `TBON_ERR_BUSY`.
#define TBON_CLIENT_SENDS_INFLIGHT_MAX 256

// Receives one client may have posted (`tbon_client_recv_cb`), and names it may watch
// (`tbon_client_watch`): one more is `TBON_ERR_BUSY`.
#define TBON_CLIENT_RECEIVES_MAX 4096

// Messages one client holds for receives not yet made (beyond it the library stops reading
// its socket, and the senders wait), and messages set aside by `tbon_client_recv` for being
// longer than the buffer (beyond it a receive that matches none of them is `TBON_ERR_BUSY`).
#define TBON_CLIENT_UNMATCHED_MAX 4096

// The most members a group may have (`tbon_group_new`: `TBON_ERR_TOO_LARGE` beyond).
#define TBON_GROUP_MEMBERS_MAX (1 << 20)

// Group collectives one daemon may have called and not yet seen end, all its groups
// together: one more is refused `TBON_ERR_BUSY` (it takes no number; call it again once one
// of them ended).
#define TBON_GROUP_INFLIGHT_MAX 256

// The longest key of the data exchange, in bytes (without the NUL): longer is
// `TBON_ERR_BAD_PARAM`.
#define TBON_MODEX_KEY_MAX 255

// Groups a daemon keeps data of the exchange for (puts or commits), until
// `tbon_forget_group`: a put or commit for one more is refused `TBON_ERR_BUSY`.
#define TBON_MODEX_GROUPS_MAX 256

// Fetches of an owner's data (one per owner and group, shared by the gets waiting for it) a
// daemon has in flight: a get that needs one more ends `TBON_ERR_BUSY` (ask again later).
#define TBON_MODEX_FETCHES_MAX 256

// `tbon_status_get`/`tbon_status_query` flag: every daemon in detail (by default a healthy
// subtree is summarised; the JSON is then shorter, the per-rank states the same).
#define TBON_STATUS_ALL 1

// `timeout_ms` of `tbon_writer_write` and `tbon_stream_read`: wait without a limit (a
// stream still never waits past its idle time, and a writer's consumer cancels or dies).
#define TBON_WAIT_FOREVER 4294967295

// The producer's `fail` code when a stream fails because its service callback returned
// without ending it.
#define TBON_STREAM_FAIL_ABANDONED 4294967293

// The producer's `fail` code when it had no room for another stream (1,024 streams, or their
// windows summed beyond 512 MiB): try again later.
#define TBON_STREAM_FAIL_NO_ROOM 4294967294

// Codes at or above this are the runtime's; `tbon_writer_fail` refuses them.
#define TBON_STREAM_FAIL_RESERVED_MIN 4294967280

// `tbon_fetch_opts.route`: the daemons' `route` settings decide (0, so that a zeroed
// `tbon_fetch_opts` means every default).
#define TBON_FETCH_ROUTE_SETTING 0

// `tbon_fetch_opts.route`: ask for no direct link because of this stream.
#define TBON_FETCH_ROUTE_TREE 1

// `tbon_fetch_opts.route`: ask the producer for a direct link (it must grant it).
#define TBON_FETCH_ROUTE_DIRECT 2

// Result code of every tbon call (and the argument of send completions).
typedef enum {
  // Success.
  TBON_OK = 0,
  // A null pointer where one is not allowed, a string that is not UTF-8, a bad value.
  TBON_ERR_BAD_PARAM = 1,
  // The handle is not (or no longer) known: never created, or already freed.
  TBON_ERR_BAD_HANDLE = 2,
  // The tag is reserved for the runtime (user tags are >= TBON_TAG_USER_MIN).
  TBON_ERR_RESERVED_TAG = 3,
  // No such rank in this DVM.
  TBON_ERR_RANK_OUT_OF_RANGE = 4,
  // The payload exceeds `msg_max_bytes`, a group has more than `TBON_GROUP_MEMBERS_MAX`
  // members, a group's data for the exchange exceeds its bound (`tbon_put`), or a caller
  // buffer is too small (see the call).
  TBON_ERR_TOO_LARGE = 5,
  // The destination is known to have failed (for `tbon_get`: the owner of the value; for a
  // client's send: the receiver's daemon died before answering, and the message may or may
  // not have arrived).
  TBON_ERR_NODE_DOWN = 6,
  // No route leads to the destination (`tbon_client_connect`: no daemon at the socket, or
  // it broke the protocol).
  TBON_ERR_UNREACHABLE = 7,
  // A bounded queue is full (retry later), or a blocking call was made from a callback.
  TBON_ERR_BUSY = 8,
  // The daemon is shutting down or has stopped.
  TBON_ERR_SHUT_DOWN = 9,
  // The timeout passed first.
  TBON_ERR_TIMED_OUT = 10,
  // A receive for exactly this (peer, tag) is already posted, or this daemon already used
  // this collective id (for a group: another `tbon_group` of the same context and members
  // ran this collective's number on this daemon).
  TBON_ERR_DUPLICATE = 11,
  // An unknown setting name, a bad setting value, or an invalid configuration.
  TBON_ERR_CONFIG = 12,
  // The daemon could not start (bad rank/size, bad or missing rank 0 URI, no address, I/O).
  TBON_ERR_START = 13,
  // A bug inside tbon (a caught Rust panic); the call had no effect or an unknown one.
  TBON_ERR_INTERNAL = 14,
  // Streams: the producer has no such service.
  TBON_ERR_NO_SERVICE = 15,
  // Streams: the producer failed the stream (its code: `tbon_stream_fail_code`; a message
  // with its reason: `tbon_last_error`).
  TBON_ERR_STREAM_FAILED = 16,
  // Streams: the other end of the stream (producer or consumer) died, or its daemon stopped.
  TBON_ERR_PEER_DIED = 17,
  // Streams: the consumer cancelled the stream.
  TBON_ERR_CANCELLED = 18,
  // Streams: corrupt data, or the other end broke the protocol. `tbon_get`: the owner's
  // data came back malformed.
  TBON_ERR_CORRUPT = 19,
  // Streams: nothing arrived from the producer for the stream's idle time.
  TBON_ERR_IDLE = 20,
  // Status: the daemon refused the operator credential (a wrong one, another DVM, or too
  // many tools connected).
  TBON_ERR_CREDENTIAL = 21,
  // Groups: this daemon, the broadcast's root, or the rank a `tbon_get` asks, is not a
  // member of the group.
  TBON_ERR_NOT_MEMBER = 22,
  // Collectives: the collective ended without its result at this member (after a repair,
  // or on a daemon that rejoined for a collective finished before it was admitted, every
  // daemon its late contribution reached had already forgotten the result; the other
  // members may have it).
  TBON_ERR_RESULT_LOST = 23,
  // Data exchange (`tbon_get`): the owner committed no value under this key for the group
  // (never put, or not committed before the fence the get followed).
  TBON_ERR_NOT_FOUND = 24,
  // Groups: the members called different collectives under one number (another kind,
  // another broadcast root, another fence mode); every member ends it with this. The
  // members are out of step; the group stays usable for the next number.
  TBON_ERR_MISMATCH = 25,
  // Clients: no client of that name was ever admitted by its daemon (or the rank is not in
  // the DVM).
  TBON_ERR_UNKNOWN_CLIENT = 26,
  // Clients: the receiver belongs to a job that does not accept messages from the
  // sender's (`accept_from` of `tbon_client_job`).
  TBON_ERR_NOT_PERMITTED = 27,
  // Clients: the receiver has exited; the message was not delivered.
  TBON_ERR_CLIENT_GONE = 28,
  // Clients: this client's connection to its daemon is gone (the daemon died or stopped,
  // or the client was closed): nothing more can be sent or received.
  TBON_ERR_DAEMON_LOST = 29,
  // Clients: the daemon refused the connection (wrong key, job not open, uid not allowed,
  // too many clients; the daemon's reason in `tbon_last_error`).
  TBON_ERR_REFUSED = 30,
  // Clients: the daemon has no client socket (its `client_socket` setting is unset).
  TBON_ERR_NO_SOCKET = 31,
} tbon_rc;

// A log record's level (`tbon_log_callback`), most severe first; `TBON_LOG_OFF` records
// nothing.
typedef enum {
  TBON_LOG_OFF = 0,
  TBON_LOG_ERROR = 1,
  TBON_LOG_WARN = 2,
  TBON_LOG_INFO = 3,
  TBON_LOG_DEBUG = 4,
  TBON_LOG_TRACE = 5,
} tbon_log_level;

// Why a daemon stopped (`tbon_stop_reason`). Only `TBON_STOP_REQUESTED`,
// `TBON_STOP_DVM_SHUTDOWN` and `TBON_STOP_LEFT` are orderly ends; a supervisor should treat
// the others as this daemon's failure.
typedef enum {
  // Still running.
  TBON_STOP_RUNNING = 0,
  // A local `tbon_shutdown` (or `tbon_shutdown_dvm` on rank 0, or on another rank).
  TBON_STOP_REQUESTED = 1,
  // Rank 0 shut the DVM down (an orderly end of the whole DVM).
  TBON_STOP_DVM_SHUTDOWN = 2,
  // A local `tbon_abort`.
  TBON_STOP_ABORTED = 3,
  // This daemon lost rank 0, or could not reach it (or its parent) during wire-up; the
  // text names the cause ("cannot reach rank 0" when it was never reached).
  TBON_STOP_ROOT_LOST = 4,
  // The DVM declared this daemon dead and fenced it: this daemon may not come back, but a
  // new one started with the setting `rejoin` (`tbon_config_set(cfg, "rejoin", "true")`,
  // `tbon daemon --rejoin`) may take its rank back.
  TBON_STOP_DECLARED_DEAD = 5,
  // Anything else (a contact table for another size, left out of wire-up, no table in time,
  // the event loop failed, ...); the text says why.
  TBON_STOP_FATAL = 6,
  // This daemon left the DVM in order (`tbon_leave`): an orderly end.
  TBON_STOP_LEFT = 7,
} tbon_stop;

// Which repair a fault handler reports.
typedef enum {
  // This daemon learned of the death itself (lost connection, missed heartbeats).
  TBON_SCOPE_LOCAL = 0,
  // Rank 0 confirmed the death to every daemon, with a new epoch.
  TBON_SCOPE_GLOBAL = 1,
} tbon_scope;

// Why a watched client is reported gone (`tbon_client_watch_cb`).
typedef enum {
  // Its connection to its daemon closed: it exited, crashed or called `tbon_client_close`
  // (also before the watch reached its daemon).
  TBON_CLIENT_EXITED = 1,
  // Its daemon died (or stopped), or was known dead when the watch was made.
  TBON_CLIENT_DAEMON_DIED = 2,
  // No client of that name was ever admitted (or the rank is not in the DVM).
  TBON_CLIENT_UNKNOWN = 3,
} tbon_client_exit;

// What a status says of one rank (`tbon_status_rank`).
typedef enum {
  // It answered, in detail.
  TBON_RANK_ALIVE = 0,
  // It answered, within a healthy subtree summarised in one part.
  TBON_RANK_HEALTHY = 1,
  // The DVM declared it failed.
  TBON_RANK_DEAD = 2,
  // Its parent asked it and it did not answer within the budget (stuck, stopped,
  // overloaded, or dying): suspected.
  TBON_RANK_NO_ANSWER = 3,
  // Below a daemon that did not answer: not known.
  TBON_RANK_UNKNOWN = 4,
  // Alive in the tree but covered by no answer (the tree changed during the query).
  TBON_RANK_UNREACHED = 5,
  // Outside the subtree of the daemon asked (a daemon other than rank 0 answers for its
  // subtree only).
  TBON_RANK_NOT_COVERED = 6,
  // It left the DVM in order (`tbon_leave`): not a fault.
  TBON_RANK_DEPARTED = 7,
  // Room to grow (`initial_size`) that has not joined: not a fault.
  TBON_RANK_ABSENT = 8,
} tbon_rank_state;

// How a fence exchanges the data (`tbon_fence`, `tbon_fence_cb`, which take it as an `int`).
typedef enum {
  // Every member's committed data comes to every member during the fence: the gets after
  // it are answered on this daemon, without a message. For small data and gets of most
  // members' values (PMI's "collect data").
  TBON_FENCE_FULL = 0,
  // The fence only synchronises: a get fetches the owner's data (all of its keys at once,
  // then cached here) on first use. For large data or gets of a few members.
  TBON_FENCE_DIRECT = 1,
} tbon_fence_mode;

// Receives one log record: its level, its target (the module, e.g. "tbon::node::faults"),
// the message (both NUL-terminated, valid during the call only) and the `user` pointer given
// to `tbon_log_callback`.
typedef void (*tbon_log_cb)(tbon_log_level level,
                            const char *target,
                            const char *message,
                            void *user);

// A configuration: an id from `tbon_config_new`/`tbon_config_from_env`; 0 is never valid.
typedef uint64_t tbon_config;

// A daemon: an id from `tbon_start`; 0 is never valid. Ids are never reused, so a freed one
// gives `TBON_ERR_BAD_HANDLE`.
typedef uint64_t tbon_daemon;

// Send completion: called once, on the loop thread, with `TBON_OK` when the message was handed
// to the kernel on the first hop (or delivered, for a self-send; for `tbon_send_reliable`, once
// the destination posted it), otherwise the error (`TBON_ERR_NODE_DOWN`,
// `TBON_ERR_UNREACHABLE`, `TBON_ERR_BUSY`, `TBON_ERR_SHUT_DOWN`).
typedef void (*tbon_send_cb)(tbon_rc rc, void *user);

// One message of `tbon_send_batch`.
typedef struct {
  // The destination rank.
  uint32_t dst;
  // The tag (at least `TBON_TAG_USER_MIN`).
  uint32_t tag;
  // The payload (may be NULL when `len` is 0); copied before `tbon_send_batch` returns.
  const void *data;
  // How many bytes `data` points to.
  size_t len;
} tbon_outgoing;

// Frees a zero-copy payload (`tbon_send_nocopy`): called with the `data` and `free_user` given.
typedef void (*tbon_free_cb)(void *data, void *free_user);

// One daemon's contribution in an allgather result (see `tbon_allgather_cb`).
typedef struct {
  // The contributing rank.
  uint32_t rank;
  // Its bytes (NULL when `len` is 0), valid only during the callback.
  const uint8_t *data;
  // How many bytes `data` points to.
  size_t len;
} tbon_contribution;

// Allgather result callback: called once, on the loop thread. With `TBON_OK`: `count`
// contributions ordered by rank (every living daemon's) and the `nexcluded` excluded ranks,
// ascending (those that died before their contribution reached the tree); both arrays, and the
// bytes they point to, are valid only during the call. Otherwise the arrays are NULL and the
// counts 0: `TBON_ERR_TOO_LARGE` (the gathered bytes exceeded the bound: the collective
// overflowed everywhere), `TBON_ERR_DUPLICATE` (this daemon already used `id`),
// `TBON_ERR_BUSY` (too many collectives in flight here), `TBON_ERR_RESULT_LOST` (only on a
// daemon that rejoined or joined, for a collective that finished before it was admitted and
// whose result no daemon it asked still had), `TBON_ERR_SHUT_DOWN`.
typedef void (*tbon_allgather_cb)(tbon_rc rc,
                                  uint64_t id,
                                  const tbon_contribution *contributions,
                                  size_t count,
                                  const uint32_t *excluded,
                                  size_t nexcluded,
                                  void *user);

// Receive callback: called on the loop thread for each matched message. `data` (may be NULL
// when `len` is 0) is valid only until the callback returns: copy what you keep.
typedef void (*tbon_recv_cb)(uint32_t origin,
                             uint32_t tag,
                             const uint8_t *data,
                             size_t len,
                             void *user);

// Fault handler: called on the loop thread after every repair of this daemon's tree. Every
// survivor gets `TBON_SCOPE_GLOBAL` once rank 0 confirmed the death. `TBON_SCOPE_LOCAL` comes
// first, and only on a daemon that learned of the death itself before that: the dead
// daemon's tree neighbours (its connection broke, or its heartbeats stopped), and its children
// adopted by a new parent (told by the adoption notice); a daemon far from it sees only
// `TBON_SCOPE_GLOBAL`. `failed` lists the newly failed ranks, ascending (valid during the call
// only). `epoch` is the DVM epoch the repair carries, 0 when it carries none (local repairs).
typedef void (*tbon_fault_cb)(const uint32_t *failed,
                              size_t nfailed,
                              tbon_scope scope,
                              uint64_t epoch,
                              void *user);

// One repair of a daemon's tree, as `tbon_on_repair` hands it over: the pointers are valid
// during the call only (copy what you keep); each list is ascending, NULL when empty.
typedef struct {
  // Ranks newly known to have failed (as `tbon_fault_cb` gets them).
  const uint32_t *failed;
  size_t nfailed;
  // Ranks back in the tree: daemons restarted under their rank (rejoin), or new ranks of a
  // DVM started with room to grow (join).
  const uint32_t *restored;
  size_t nrestored;
  // Ranks that left in order (`tbon_leave`): repaired around, not failures.
  const uint32_t *departed;
  size_t ndeparted;
  // `TBON_SCOPE_LOCAL` or `TBON_SCOPE_GLOBAL`, as for `tbon_fault_cb`.
  tbon_scope scope;
  // The DVM epoch the repair carries, 0 when it carries none (local repairs).
  uint64_t epoch;
} tbon_repair;

// Repair handler (`tbon_on_repair`): called on the loop thread after every repair of this
// daemon's tree, with what changed (`repair` valid during the call only).
typedef void (*tbon_repair_cb)(const tbon_repair *repair, void *user);

// A snapshot of one daemon's counters (`tbon_counters`), counts since it started.
typedef struct {
  // Messages this daemon originated (including self-sends).
  uint64_t sent;
  // Messages delivered to a receive on this daemon.
  uint64_t delivered;
  // Plain messages for other daemons forwarded by this one (a batch frame of
  // `tbon_send_batch`, several small messages to one destination, counts once).
  uint64_t relayed;
  // Broadcast operations sent to children (one per part of a split payload), replays
  // included.
  uint64_t xcast_forwarded;
  // Messages dropped because no route led to their destination.
  uint64_t dropped_unreachable;
  // Held (unmatched) messages dropped to keep the unmatched list within its bound.
  uint64_t dropped_unmatched;
  // Connections closed because the peer broke the protocol.
  uint64_t protocol_errors;
  // Outgoing connection attempts that were retried.
  uint64_t reconnects;
  // Commands received from other threads; a `tbon_send_batch` counts one per message.
  uint64_t commands;
  // Wake-up system calls paid to rouse the loop.
  uint64_t wakeups;
  // Frames dropped because they came from a rank known to have failed.
  uint64_t dropped_stale;
  // Repairs of the routing tree (local and global scope each count).
  uint64_t repairs;
  // How many ranks this daemon knows have failed.
  uint64_t failed_count;
  // Connections currently open.
  uint64_t connections;
  // The DVM epoch this daemon knows.
  uint64_t epoch;
  // The current parent in the tree, `TBON_RANK_NONE` if none (rank 0).
  uint32_t parent;
  // How many children this daemon currently has in the tree.
  uint32_t children_count;
  // Reliable messages originated here (self-sends excluded).
  uint64_t relm_sent;
  // Reliable messages posted here (handed to receive matching), each once.
  uint64_t relm_posted;
  // Copies of reliable messages discarded here as already posted.
  uint64_t relm_duplicates;
  // Reliable messages retransmitted by this daemon as their origin.
  uint64_t relm_retransmits;
  // Reliable messages replayed from this daemon's record on a neighbour's request.
  uint64_t relm_replays;
  // RELM updates ignored (not from the right neighbour, or a stale link update).
  uint64_t relm_ignored;
  // Reliable messages evicted from this daemon's hop cache.
  uint64_t relm_evicted;
  // Reliable messages refused here (pending bound or full unmatched list); replayed later.
  uint64_t relm_refused;
  // RELM link updates sent.
  uint64_t relm_link_updates;
  // Reliable messages for other daemons forwarded by this one as a hop.
  uint64_t relm_relayed;
  // Reliable messages originated here and not yet acknowledged.
  uint64_t relm_unacked;
  // Reliable messages held in this daemon's hop cache.
  uint64_t relm_cached;
  // Early reliable messages held here while their predecessor is missing.
  uint64_t relm_pending;
  // Broadcasts delivered here (user broadcasts and the DVM's notices), each once; a payload
  // split into parts counts once.
  uint64_t xcast_delivered;
  // Broadcasts originated here that every living daemon delivered.
  uint64_t xcast_completed;
  // Broadcasts originated here that rank 0 refused (its window was full).
  uint64_t xcast_refused;
  // Rank 0: broadcast requests it refused.
  uint64_t xcast_requests_refused;
  // Rank 0: broadcast requests that waited for room in its window.
  uint64_t xcast_requests_held;
  // Broadcast operations received again and ignored.
  uint64_t xcast_duplicates;
  // Broadcast operations ignored because they did not come from this daemon's parent.
  uint64_t xcast_not_from_parent;
  // Resume requests sent to the parent (after a repair, a gap or a lost link).
  uint64_t xcast_resumes;
  // Broadcast operations dropped at the retained bound (fetched again later).
  uint64_t xcast_dropped_full;
  // Collective tree messages ignored as stale.
  uint64_t xcast_stale;
  // Broadcast operations held here.
  uint64_t xcast_retained;
  // Broadcasts originated here awaiting rank 0's answer.
  uint64_t xcast_outstanding;
  // Allgather contributions sent to the parent (re-sends included).
  uint64_t allgather_sent;
  // Allgather contributions received from children.
  uint64_t allgather_received;
  // Allgather contributions received under another view of the tree.
  uint64_t allgather_other_view;
  // Allgather contributions that arrived after the result.
  uint64_t allgather_late;
  // Allgathers that exceeded the gathered-bytes bound here.
  uint64_t allgather_overflowed;
  // Allgather contributions dropped because too many collectives had state here.
  uint64_t allgather_dropped_untracked;
  // Allgather and barrier results delivered here.
  uint64_t allgather_results;
  // Collectives this daemon keeps state for.
  uint64_t allgather_tracked;
  // Times a link's collective messages were re-stated (reconnection, or drops at a full
  // queue).
  uint64_t grpcomm_resyncs;
  // Collective messages that did not decode.
  uint64_t grpcomm_malformed;
  // Frames dropped because they carried an older incarnation of their sender than one
  // already seen (left over from before the sender restarted).
  uint64_t dropped_old_incarnation;
  // Fault reports that waited for room in the reliable-send window (delayed, never dropped).
  uint64_t reports_delayed;
  // Pending handshakes closed to make room under the pending-handshake bounds.
  uint64_t handshakes_evicted;
  // Connections closed because their handshake timed out.
  uint64_t handshakes_timed_out;
  // Accepted connections whose peer hung up before proving it holds the job key.
  uint64_t handshakes_abandoned;
  // Connections refused in their handshake (wrong DVM, wrong MAC, malformed), or at accept
  // beyond the connection bound; each counted once.
  uint64_t handshakes_refused;
  // Refusal log lines not written because of the rate limit.
  uint64_t log_lines_suppressed;
  // Times a send queue towards a neighbour became congested (reads from the others paused
  // until it drained).
  uint64_t flow_congested;
  // Sends refused `TBON_ERR_BUSY` by flow control: the queue towards their next hop was
  // congested, or the command queue already held its share of payload bytes.
  uint64_t sends_busy_flow;
  // Reliable sends refused `TBON_ERR_BUSY` at the call because `relm_unacked_max` reliable
  // messages of this daemon were unacknowledged.
  uint64_t relm_busy;
  // Direct links (setting `route`): requests for a link this daemon sent.
  uint64_t direct_requests_sent;
  // Requests other daemons sent this one.
  uint64_t direct_requests_received;
  // Requests this daemon granted.
  uint64_t direct_grants;
  // Denials this daemon's requests met (every reason; the Rust counters split them).
  uint64_t direct_denied;
  // Sends that would have asked for a link but found a recent denial cached.
  uint64_t direct_denial_cache_hits;
  // Links in use now (granted or open).
  uint64_t direct_links_open;
  // Links that fell back to the tree (connection lost, grant withdrawn).
  uint64_t direct_fallbacks;
  // Idle direct links this daemon closed to make room for a new one.
  uint64_t direct_links_evicted;
  // User messages originated here that took a direct link, and their payload bytes.
  uint64_t direct_messages;
  uint64_t direct_bytes;
  // User messages originated here for other daemons that took the tree, and their bytes.
  uint64_t direct_tree_messages;
  uint64_t direct_tree_bytes;
  // Denials this daemon sent to other daemons' requests.
  uint64_t direct_denials_sent;
  // Denials this daemon's requests met, by reason: the other daemon's `route` is `tree`;
  // it had no room (`direct_links_max`); no answer in time or the connection could not be
  // made; the other daemon died. (`direct_denied` is their sum with the rarer reasons.)
  uint64_t direct_denied_policy;
  uint64_t direct_denied_full;
  uint64_t direct_denied_timeout;
  uint64_t direct_denied_dead;
  // Links that opened (both ends count one).
  uint64_t direct_links_opened;
  // Sends that would have asked for a link but this daemon had no room and none idle.
  uint64_t direct_no_room;
  // Frames dropped at a hard queue bound: a relay's full send queue, or a message without
  // a completion beyond what may wait while a direct link closes.
  uint64_t dropped_queue_full;
  // Streams, producer side: streams opened here by consumers (a resumed stream opens
  // again), opens refused (no such service, no room), data bytes sent.
  uint64_t stream_served;
  uint64_t stream_refused;
  uint64_t stream_bytes_sent;
  // Streams, consumer side: fetched, finished, ended with an error (cancels included),
  // resumed at the byte they stood at, probes sent (a quarter of the idle time without
  // news), data bytes received and checked.
  uint64_t stream_fetched;
  uint64_t stream_finished;
  uint64_t stream_failed;
  uint64_t stream_resumes;
  uint64_t stream_probes;
  uint64_t stream_bytes_received;
  // Streams open now: produced here, and fetched here.
  uint64_t stream_producing;
  uint64_t stream_consuming;
  // Group collectives: contributions sent up and received, results sent down (passed on
  // or answered), late contributions answered, contributions dropped at the tracked bound,
  // results delivered here, collectives with state here (`tbon_group_*`).
  uint64_t group_sent;
  uint64_t group_received;
  uint64_t group_results_sent;
  uint64_t group_answered_late;
  uint64_t group_dropped_untracked;
  uint64_t group_results;
  uint64_t group_tracked;
  // Data exchange (`tbon_get`): gets answered here without a message (from the cache, a
  // full fence's or an earlier fetch's, or this daemon's own data), fetches of an owner's
  // data (one per owner and group, shared by the gets waiting for it), fetches answered
  // for other daemons, and owners' data evicted from the cache.
  uint64_t modex_hits;
  uint64_t modex_fetches;
  uint64_t modex_served;
  uint64_t modex_evicted;
  // Rejoin and grow: ranks this daemon put back into its tree (restarted daemons admitted
  // again, new ranks joined), ranks it repaired around that left in order (`tbon_leave`),
  // and frames it dropped as sent by or for another life of a rank than the one it knows.
  uint64_t rejoins;
  uint64_t departures;
  uint64_t dropped_other_life;
  // Link sessions (a broken connection between two living daemons loses nothing):
  // connections on which frames written before a break were written again, those frames,
  // frames that came again and were dropped as already here, frames given up because the
  // neighbour refused the session (a frame of it broke the protocol there), and
  // resumptions past frames never received (cannot happen between correct peers).
  uint64_t link_resumes;
  uint64_t link_frames_resent;
  uint64_t link_duplicates_dropped;
  uint64_t link_frames_given_up;
  uint64_t link_gaps;
  // Connections closed as stalled and dialled again at the peer's next address (failover).
  uint64_t link_failovers;
  // Streams: bulk connections this daemon dialled and had admitted (a second connection
  // to a neighbour carrying only its stream data; setting `bulk_connection`).
  uint64_t bulk_connections;
} tbon_counters;

// A client process's connection to its daemon: an id from `tbon_client_connect` or
// `tbon_client_from_env`, valid until `tbon_client_close`; 0 is never valid.
typedef uint64_t tbon_client;

// Client receive callback (`tbon_client_recv_cb`): the sender's name (`from_rank`,
// `from_local`), the tag, and the payload (`data` NULL when `len` is 0), valid only during
// the call: copy what you keep.
typedef void (*tbon_client_msg_cb)(uint32_t from_rank,
                                   uint32_t from_local,
                                   uint32_t tag,
                                   const uint8_t *data,
                                   size_t len,
                                   void *user);

// Watch callback (`tbon_client_watch`): called once with the watched client's name and why
// it is gone.
typedef void (*tbon_client_watch_cb)(uint32_t rank,
                                     uint32_t local,
                                     tbon_client_exit reason,
                                     void *user);

// Daemon-lost callback (`tbon_client_on_daemon_lost`): called once with why the connection
// ended (NUL-terminated, valid during the call only).
typedef void (*tbon_client_lost_cb)(const char *reason, void *user);

// A group of daemons for group collectives (the daemons one job runs on): an id from
// `tbon_group_new`, valid until `tbon_group_free`; 0 is never valid.
typedef uint64_t tbon_group;

// Group broadcast callback (`tbon_group_broadcast`): called once, on the loop thread. With
// `TBON_OK`, `data` holds the root's `len` bytes (NULL when `len` is 0), valid only during the
// call: copy what you keep. Otherwise `data` is NULL and `len` 0: `TBON_ERR_NODE_DOWN` (the
// root died before its bytes reached the tree), `TBON_ERR_TOO_LARGE` (the root's bytes and 8
// bytes per member exceeded the 16 MiB gathered-bytes bound, or `msg_max_bytes`),
// `TBON_ERR_DUPLICATE`, `TBON_ERR_MISMATCH`, `TBON_ERR_RESULT_LOST`, `TBON_ERR_SHUT_DOWN` (see
// `tbon_group_allgather`). `seq` is the collective's number in the group.
typedef void (*tbon_group_broadcast_cb)(tbon_rc rc,
                                        uint64_t seq,
                                        const uint8_t *data,
                                        size_t len,
                                        void *user);

// Fence callback (`tbon_fence_cb`): called once, on the loop thread. With `TBON_OK`, every
// living member entered the fence, and `excluded` lists the `nexcluded` members that died
// before they entered it, ascending (NULL when there are none; valid during the call only).
// Otherwise `excluded` is NULL and `nexcluded` 0, and `rc` is as `tbon_group_allgather`'s
// callback (`TBON_ERR_DUPLICATE`, `TBON_ERR_MISMATCH`: another member entered this number in
// the other mode or called another collective, `TBON_ERR_RESULT_LOST`, `TBON_ERR_SHUT_DOWN`).
// `seq` is the fence's number in the group.
typedef void (*tbon_fence_done_cb)(tbon_rc rc,
                                   uint64_t seq,
                                   const uint32_t *excluded,
                                   size_t nexcluded,
                                   void *user);

// Get callback (`tbon_get_cb`): called once, on the loop thread, with the `rank` and `key`
// asked for (`key` NUL-terminated). With `TBON_OK`, `data` holds the value's `len` bytes (NULL
// when `len` is 0). Otherwise `data` is NULL and `len` 0: `TBON_ERR_NOT_FOUND` (`rank` had
// committed no such key for the group when its data was taken; see `tbon_get`),
// `TBON_ERR_NODE_DOWN` (`rank` is dead, or died before its data came), `TBON_ERR_BUSY`
// (`TBON_MODEX_FETCHES_MAX` fetches in flight here), `TBON_ERR_CORRUPT` (its data came back
// malformed), `TBON_ERR_SHUT_DOWN`. `key` and `data` are valid during the call only: copy
// what you keep.
typedef void (*tbon_get_done_cb)(tbon_rc rc,
                                 uint32_t rank,
                                 const char *key,
                                 const uint8_t *data,
                                 size_t len,
                                 void *user);

// A status gathered from a DVM (0 is never a valid handle). Free it with `tbon_status_free`.
typedef uint64_t tbon_status;

// The counts of a status (`tbon_status_summary`).
typedef struct {
  // The DVM's size, radix and epoch, and the rank that gathered the status.
  uint32_t size;
  uint32_t radix;
  uint64_t epoch;
  uint32_t from;
  // Ranks that answered, declared dead, silent, unknown below a silent one, unreached.
  uint32_t answered;
  uint32_t dead;
  uint32_t no_answer;
  uint32_t unknown;
  uint32_t unreached;
  // Microseconds the gathering daemon took.
  uint64_t elapsed_us;
  // 1 when detail was dropped to keep the answer bounded.
  uint8_t truncated;
  // 1 when the daemons' views of the tree differed (a repair under way): ask again.
  uint8_t views_differ;
  // Ranks that left in order, and ranks of the room to grow not joined (neither is dead).
  uint32_t departed;
  uint32_t absent;
} tbon_status_counts;

// The writer of one stream a service answers: an id valid from the service callback's
// start until `tbon_writer_finish`/`tbon_writer_fail` or the callback's return; 0 is never
// valid.
typedef uint64_t tbon_writer;

// A service: called for every stream a consumer opens, on a thread of its own (it may block
// as long as it needs: reading a file, waiting for credit). `service` and `request` are valid
// during the call. Write the answer from byte `offset` on (0 for a new stream; a stream the
// consumer resumed after its path broke asks again from the byte it stands at) with
// `tbon_writer_write`, then end it with `tbon_writer_finish` or `tbon_writer_fail` before
// returning: a stream not ended at the return fails with `TBON_STREAM_FAIL_ABANDONED`.
typedef void (*tbon_serve_cb)(tbon_writer w,
                              uint32_t consumer,
                              const char *service,
                              const uint8_t *request,
                              size_t len,
                              uint64_t offset,
                              void *user);

// How a stream is fetched (`tbon_fetch`, `tbon_fetch_cb`; NULL there: every default).
typedef struct {
  // Bytes the producer may send ahead of what was read (the credit window; it bounds the
  // stream's memory here and on every relay). 0: 4 MiB; at most 64 MiB (a larger window is
  // cut to 64 MiB), at least 64 KiB (a smaller one, which crawls, is raised to 64 KiB).
  uint32_t window;
  // How long the stream waits for data from the producer while it owes bytes, before it
  // ends `TBON_ERR_IDLE` (a service must send its first bytes within it; a slower one is
  // probed each quarter of it, not called again). 0: 60 s.
  uint32_t idle_ms;
  // `TBON_FETCH_ROUTE_SETTING` (0: the daemons' `route` settings decide, as for a
  // message), `TBON_FETCH_ROUTE_TREE` (ask for no direct link) or `TBON_FETCH_ROUTE_DIRECT`
  // (ask the producer for one), for the stream's messages both ways.
  int route;
} tbon_fetch_opts;

// A stream this daemon fetches (`tbon_fetch`): an id valid until `tbon_stream_close`; 0 is
// never valid. Close every stream, also after its daemon stopped or was freed: until then it
// holds its memory. A stream whose daemon stopped still gives the bytes that had arrived (up
// to a window), then `TBON_ERR_SHUT_DOWN`, also once the daemon is freed.
typedef uint64_t tbon_stream;

// How a stream ended, for `tbon_fetch_cb`: `rc` is `TBON_OK` when it finished (every byte
// arrived and checked), otherwise why not (see `tbon_stream_read`). `fail_code` and
// `reason` are the producer's when `rc` is `TBON_ERR_STREAM_FAILED`; `reason` is never NULL
// ("" when there is none) and valid during the call.
typedef struct {
  tbon_rc rc;
  uint32_t fail_code;
  const char *reason;
} tbon_stream_end;

// Stream callback (`tbon_fetch_cb`): called on the loop thread for each chunk in order
// (`end` NULL, `data` valid during the call, `len` > 0), then once with `end` set (`data`
// NULL, `len` 0). A chunk counts as consumed, and the producer gets credit, when the
// callback returns. Keep it short; it must not block.
typedef void (*tbon_stream_cb)(const uint8_t *data,
                               size_t len,
                               const tbon_stream_end *end,
                               void *user);

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Sends tbon's log records at or below `max_level` to `cb`, for the whole process, from now
// on. Call it once, before `tbon_start`: a process has one logger, so a second call (or one
// in a process whose Rust side already installed a logger) answers `TBON_ERR_BUSY` and
// changes nothing. `cb` runs on whichever thread logs (a daemon's loop thread, mostly),
// possibly on several at once; it must be quick, thread-safe, and must not call tbon.
// `max_level` is a `tbon_log_level` value. `TBON_ERR_BAD_PARAM` for a NULL `cb` or a level
// outside `TBON_LOG_OFF..TBON_LOG_TRACE`.
tbon_rc tbon_log_callback(tbon_log_cb cb, void *user, int max_level);

extern int pthread_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void));

// A static, NUL-terminated description of a result code (never NULL; unknown codes get
// "unknown tbon_rc"). Takes an `int` so that any value is safe to pass.
const char *tbon_strerror(int rc);

// A description of the last call on this thread that returned an error (more detail than
// `tbon_strerror`, e.g. which setting was bad). "" if none. Owned by tbon: valid until the next
// tbon call on this thread.
const char *tbon_last_error(void);

// Creates a configuration with the defaults and stores its id in `*out`. Reads no environment
// variable (nor does `tbon_start`): set the key with `tbon_config_set(cfg, "key_file", path)`.
tbon_rc tbon_config_new(tbon_config *out);

// Like `tbon_config_new`, then applies every `TBON_<NAME>` environment variable that is set,
// takes the job key itself from `TBON_KEY` when no `TBON_KEY_FILE` is set, and validates. `TBON_ERR_CONFIG` names the bad variable in `tbon_last_error()`.
tbon_rc tbon_config_from_env(tbon_config *out);

// Sets one setting by name, from text: the names of the `TBON_<NAME>` environment variables
// (`"if_include"`, `"IF_INCLUDE"`, `"TBON_IF_INCLUDE"` and `"if-include"` all work), the same
// syntax (lists comma-separated, booleans true/false/yes/no/on/off/1/0). Only the syntax is
// checked here; `tbon_start` validates the whole. Unknown name or bad value: `TBON_ERR_CONFIG`.
tbon_rc tbon_config_set(tbon_config cfg, const char *name, const char *value);

// Frees a configuration. Daemons started with it keep their own copy.
tbon_rc tbon_config_free(tbon_config cfg);

// Starts daemon `rank` of a DVM of `size` daemons and stores its handle in `*out`. Returns once
// the listener is bound; wire-up goes on in the background (`tbon_wait_wired`). `cfg` is copied
// (0 means the defaults). `hnp_uri` is rank 0's contact URI (`tbon_contact_uri` on rank 0):
// required for every other rank, ignored (may be NULL) on rank 0.
// Errors: `TBON_ERR_CONFIG` (invalid configuration, no job key, or interface settings that
// leave no address: `if_include` naming none of this host's), `TBON_ERR_START` (bad
// rank/size, missing or bad URI, I/O such as no free port in `port_range`),
// `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM`. Not from a callback.
tbon_rc tbon_start(tbon_config cfg,
                   uint32_t rank,
                   uint32_t size,
                   const char *hnp_uri,
                   tbon_daemon *out);

// Starts a daemon the way launchers start them (`tbon::launch`): its rank and size are
// `rank` and `size`, or, where negative, read from the launcher's environment (`TBON_RANK`,
// `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`, `PMIX_RANK`; `TBON_SIZE`, `SLURM_NTASKS`,
// `OMPI_COMM_WORLD_SIZE`); rank 0 is found through `rendezvous`: `"uri:URI"`, `"file:PATH"`
// (rank 0 writes its URI there and removes it when its daemon is freed; the others wait for
// it up to the wire-up timeout; remove a file left by a run that did not end cleanly before
// the launch: a rank that reads it dials a rank 0 that is gone and fails, it does not wait
// for a new one) or `"host:NAME:PORT"` (no shared filesystem: rank 0 listens
// on PORT; the others wait up to the wire-up timeout for it to listen, then dial NAME:PORT),
// or, if NULL, from `TBON_HNP`, `TBON_HNP_FILE` or
// `TBON_HNP_HOST` (`NAME:PORT`). Rank 0 needs no rendezvous unless others look for it in a
// file or at a port. Stores the handle in `*out`; returns once the listener is bound (a rank
// other than 0 with a file: once the file was read). Errors: `TBON_ERR_CONFIG`,
// `TBON_ERR_START` (no rank or size in the environment, a rank not below the size, a
// malformed rendezvous, a file that did not appear in time or that another user owns, a host
// that does not resolve or whose port did not listen in time, and `tbon_start`'s),
// `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM`. Not from a callback.
tbon_rc tbon_launch(tbon_config cfg,
                    int64_t rank,
                    int64_t size,
                    const char *rendezvous,
                    tbon_daemon *out);

// Copies this daemon's contact URI, NUL-terminated, into `buf`. `*len` is the size of `buf` on
// entry and the size needed (URI length + 1) on return. If `buf` is too small (or NULL with
// `*len` 0, to ask the size) nothing is copied and `TBON_ERR_TOO_LARGE` is returned.
tbon_rc tbon_contact_uri(tbon_daemon d, char *buf, size_t *len);

// Stores in `*count` how many addresses this daemon listens on and publishes (one per interface
// address its `if_include`/`if_exclude`/`ipv4`/`ipv6` settings allow; on a node with several
// networks, one per network), for `tbon_address`.
tbon_rc tbon_address_count(tbon_daemon d, size_t *count);

// Copies address `index` (0 to `tbon_address_count` - 1, in the contact URI's order) as text,
// `IP:PORT` or `[IPv6]:PORT`, NUL-terminated, into `buf`. `*len` is the size of `buf` on entry
// and the size needed on return (too small, or NULL with `*len` 0: `TBON_ERR_TOO_LARGE`,
// nothing copied). An index beyond the last is `TBON_ERR_BAD_PARAM`.
tbon_rc tbon_address(tbon_daemon d, size_t index, char *buf, size_t *len);

// Stores this daemon's rank in `*out`.
tbon_rc tbon_rank(tbon_daemon d, uint32_t *out);

// Stores the number of daemons in the DVM in `*out`.
tbon_rc tbon_size(tbon_daemon d, uint32_t *out);

// Blocks until wire-up has completed (`TBON_OK`, also once the daemon stopped after it), the
// daemon stopped before it (`TBON_ERR_SHUT_DOWN`) or `timeout_ms` passed
// (`TBON_ERR_TIMED_OUT`). Sends made before are queued, not lost. Not from
// a callback.
tbon_rc tbon_wait_wired(tbon_daemon d, uint32_t timeout_ms);

// Blocks until the daemon has stopped (`TBON_OK`, whatever the reason: `tbon_stop_reason`
// tells an orderly end from a failure) or `timeout_ms` passed (`TBON_ERR_TIMED_OUT`). With 0,
// just tells whether it has stopped. The handle stays valid until `tbon_free`. Not from a
// callback.
tbon_rc tbon_wait_stopped(tbon_daemon d, uint32_t timeout_ms);

// Writes a fresh random job key (64 hex characters and a newline) to a new file at `path`,
// readable by its owner only (mode 0600): what `key_file` (`TBON_KEY_FILE`) then names for
// every daemon of the DVM, as `tbon keygen FILE` does. The file must not exist, so a running
// DVM's key is never overwritten: `TBON_ERR_CONFIG` then, or if it cannot be created (the
// cause in `tbon_last_error`); `TBON_ERR_BAD_PARAM` for a NULL or non-UTF-8 path.
tbon_rc tbon_key_generate(const char *path);

// Why the daemon stopped: stores the reason in `*reason` (`TBON_STOP_RUNNING` while it runs)
// and, if `len` is not NULL, its text: `*len` is the buffer's size in bytes on entry and the
// size the text needs (with its NUL) on return; with `buf` NULL that is all (a size query),
// else the text is copied, or `TBON_ERR_TOO_LARGE` if it does not fit (the reason is stored
// all the same). Never blocks: after `tbon_wait_stopped` answered `TBON_OK`, the reason is
// final. Callable from any thread, callbacks included, until `tbon_free`.
tbon_rc tbon_stop_reason(tbon_daemon d, tbon_stop *reason, char *buf, size_t *len);

// Stops this daemon: pending sends complete with `TBON_ERR_SHUT_DOWN`, queued frames get a
// short bounded linger, sockets close, and the loop thread is joined before this returns, so
// no callback of this daemon runs afterwards. The handle stays valid until `tbon_free`:
// whatever needs a running daemon (sends, broadcasts, collectives, the data exchange,
// receives, fault handlers, counters, status, streams, opening a job for clients) then gives
// `TBON_ERR_SHUT_DOWN`; the queries still answer (`tbon_contact_uri`, `tbon_rank`,
// `tbon_size`, `tbon_stop_reason`, `tbon_wait_stopped`, `tbon_client_socket_path`, and
// `tbon_wait_wired`: `TBON_OK` if wire-up had completed); cleanup has nothing left to do and
// is `TBON_OK` (`tbon_cancel`, `tbon_purge`, `tbon_fetch_cancel`, `tbon_forget_group`,
// `tbon_client_job_close`), as is stopping again (`tbon_shutdown`, `tbon_shutdown_dvm`,
// `tbon_abort`). After `tbon_free` every call with the handle gives `TBON_ERR_BAD_HANDLE`.
// Not from a callback.
tbon_rc tbon_shutdown(tbon_daemon d);

// Leaves the DVM in order (shrink): this daemon's own reliable messages are given a few
// seconds to be acknowledged, then rank 0 confirms its departure to every daemon (their trees
// are repaired around it, and it is not reported as a failure), and once every living daemon
// knows, the daemon stops by itself with `TBON_STOP_LEFT` (`tbon_wait_stopped`, then
// `tbon_stop_reason`). Returns at once. Sends and other commands give `TBON_ERR_SHUT_DOWN`
// from now on. Errors: `TBON_ERR_NOT_PERMITTED` on rank 0 (shut the DVM down instead),
// `TBON_ERR_BUSY` before wire-up, `TBON_ERR_SHUT_DOWN` when stopping or already leaving.
tbon_rc tbon_leave(tbon_daemon d);

// On rank 0: tells every daemon of the DVM to stop (a broadcast down the tree), then stops this
// one as `tbon_shutdown` does. On other ranks: `tbon_shutdown`. Not from a callback.
tbon_rc tbon_shutdown_dvm(tbon_daemon d);

// Stops this daemon the way a crash looks to the others (sockets closed without flushing, no
// notice), for fault injection and tests. Joins the loop thread. Not from a callback.
tbon_rc tbon_abort(tbon_daemon d);

// Stops the daemon if it is running (as `tbon_shutdown`) and frees the handle: afterwards every
// call with it returns `TBON_ERR_BAD_HANDLE`, and no callback of it runs any more, so the
// caller may free its `user` data. Not from a callback.
tbon_rc tbon_free(tbon_daemon d);

// Sends `len` bytes at `data` to rank `dst` with `tag`, without waiting. tbon COPIES the bytes
// before returning: the buffer stays the caller's and may be reused at once. `data` may be NULL
// when `len` is 0. Plain (unacknowledged) delivery; see the header's overview.
//
// `cb` (may be NULL) is called exactly once, on the loop thread, if and only if this returns
// `TBON_OK`. Argument errors are returned at once (`TBON_ERR_RESERVED_TAG`,
// `TBON_ERR_RANK_OUT_OF_RANGE`, `TBON_ERR_TOO_LARGE`), as is `TBON_ERR_SHUT_DOWN` or
// `TBON_ERR_BUSY`: the send queue towards `dst`'s next hop is congested (flow control: nothing
// was queued; offer the message again later, with back-off), or, from a callback, the command
// queue is full.
tbon_rc tbon_send(tbon_daemon d,
                  uint32_t dst,
                  uint32_t tag,
                  const void *data,
                  size_t len,
                  tbon_send_cb cb,
                  void *user);

// `tbon_send` with `route` (`TBON_ROUTE_TREE` or `TBON_ROUTE_DIRECT`) overriding the daemon's
// `route` setting for the decision whether to ask `dst` for a direct link. The message itself
// takes an open direct link to `dst` if there is one and the tree otherwise, so it never
// overtakes an earlier message to `dst`. Errors as `tbon_send`, and `TBON_ERR_BAD_PARAM` for
// another `route`.
tbon_rc tbon_send_routed(tbon_daemon d,
                         uint32_t dst,
                         uint32_t tag,
                         const void *data,
                         size_t len,
                         int route,
                         tbon_send_cb cb,
                         void *user);

// Sends the `n` messages at `msgs` as plain sends, without waiting, handed to the daemon's loop
// in groups of up to `TBON_SEND_BATCH_MAX` messages and 16 MiB of payload (one hand-over each instead of one per message: the
// call for many small messages). Every payload is COPIED (into one buffer per group) before
// this returns. Messages to one destination stay in order. No completions: use `tbon_send`
// with a callback to learn a message's fate. Consecutive messages of at most 256 bytes to one
// destination travel as one batch frame (one header and one relay hop for the run; the
// receiver still gets each message on its own).
//
// `*sent` (`sent` may be NULL) is set to how many leading messages were sent. `TBON_OK`: all
// `n`. `TBON_ERR_BUSY`: message `*sent` was refused by flow control (its next hop is
// congested), or the group it starts would take the payload bytes waiting for the loop past
// their share (about 16 MiB), or, from a callback, the command queue is full (elsewhere a
// full queue is waited for); it and those after it were not sent: offer them again later,
// with back-off (`tbon_last_error()` says which bound). An argument error in any message (`TBON_ERR_RESERVED_TAG`,
// `TBON_ERR_RANK_OUT_OF_RANGE`, `TBON_ERR_TOO_LARGE`, `TBON_ERR_BAD_PARAM` for a NULL `data`
// with a non-zero `len`, or a NULL `msgs` with a non-zero `n`) sends nothing; the message
// names the index. `TBON_ERR_SHUT_DOWN` once the daemon stopped.
tbon_rc tbon_send_batch(tbon_daemon d,
                        const tbon_outgoing *msgs,
                        size_t n,
                        size_t *sent);

// Sends `len` bytes at `data` to rank `dst` with `tag` RELIABLY, without waiting: the message
// reaches `dst`'s receive matching exactly once, in order with this daemon's other reliable
// messages to `dst`, even while daemons on its path die and the tree is repaired. Copies the
// bytes like `tbon_send`; `data` may be NULL when `len` is 0. Reliable and plain messages are
// not ordered with respect to each other.
//
// `cb` (may be NULL) is called exactly once, on the loop thread, if and only if this returns
// `TBON_OK`: with `TBON_OK` once `dst` has posted the message (delivered to a receive, or
// held for one), `TBON_ERR_NODE_DOWN` if `dst` died first, `TBON_ERR_BUSY` if the next hop
// became congested between the call and the moment the daemon took it, `TBON_ERR_SHUT_DOWN`
// if this daemon stops first,
// `TBON_ERR_UNREACHABLE` if the retransmissions ran out. A reliable send to this daemon
// itself is delivered locally and completes `TBON_OK`. Returned at once: the same errors as
// `tbon_send`, and `TBON_ERR_BUSY` when `relm_unacked_max` reliable messages of this daemon
// are unacknowledged (nothing was sent: offer it again later).
tbon_rc tbon_send_reliable(tbon_daemon d,
                           uint32_t dst,
                           uint32_t tag,
                           const void *data,
                           size_t len,
                           tbon_send_cb cb,
                           void *user);

// `tbon_send` without the copy: tbon reads `len` bytes at `data` in place, and calls
// `free_cb(data, free_user)` exactly once when it no longer needs them, WHATEVER this call
// returns (on an error, before it returns), on any thread (usually the loop thread; it counts
// as a callback). Until then the buffer must stay valid and unmodified. `free_cb` must not be
// NULL (`TBON_ERR_BAD_PARAM`, and then it is not called). `cb` and `user` as `tbon_send`.
tbon_rc tbon_send_nocopy(tbon_daemon d,
                         uint32_t dst,
                         uint32_t tag,
                         void *data,
                         size_t len,
                         tbon_free_cb free_cb,
                         void *free_user,
                         tbon_send_cb cb,
                         void *user);

// Broadcasts `len` bytes at `data` with `tag` to every living daemon, this one included: the
// fault-tolerant broadcast. Any daemon may broadcast; every living daemon delivers every
// broadcast exactly once, all in the same order (a sender's broadcasts in its order), across
// the deaths of daemons. Copies like `tbon_send`; the largest payload is `msg_max_bytes` less
// 29 bytes (`TBON_ERR_TOO_LARGE` beyond). A payload above rank 0's `bcast_part_bytes` (256
// KiB) travels down the tree in parts, each forwarded as it arrives; it is still delivered
// whole, once.
//
// `cb` (may be NULL) is called exactly once, on the loop thread, if and only if this returns
// `TBON_OK`: `TBON_OK` once every living daemon has delivered it, `TBON_ERR_BUSY` if rank 0's
// window of broadcasts in flight was full or this daemon already has its bound of
// broadcasts outstanding (256; nothing was broadcast; retry later): without `cb` such a
// refusal goes unseen, so pass one when every broadcast must go out,
// `TBON_ERR_SHUT_DOWN` if this daemon stops first.
tbon_rc tbon_broadcast(tbon_daemon d,
                       uint32_t tag,
                       const void *data,
                       size_t len,
                       tbon_send_cb cb,
                       void *user);

// Contributes `len` bytes at `data` to the allgather `id`, without waiting (copies like
// `tbon_send`; `data` may be NULL when `len` is 0). Every living daemon contributes once to
// each collective; several may be in flight, each with its own id, which must never be reused
// (barriers share the ids). `cb` (not NULL) gets the result, the same at every daemon; it is
// called exactly once if and only if this returns `TBON_OK`. Returned at once:
// `TBON_ERR_TOO_LARGE` (above 16 MiB less 8 bytes), `TBON_ERR_SHUT_DOWN`.
tbon_rc tbon_allgather(tbon_daemon d,
                       uint64_t id,
                       const void *data,
                       size_t len,
                       tbon_allgather_cb cb,
                       void *user);

// Enters barrier `id` and waits until every living daemon has entered it, or `timeout_ms`
// passed (`TBON_ERR_TIMED_OUT`: this daemon stays entered). A barrier is an allgather of empty
// contributions: same ids (never reused: `TBON_ERR_DUPLICATE`), and a daemon that died is
// not waited for. Not from a callback (`TBON_ERR_BUSY`); other errors as `tbon_allgather`.
tbon_rc tbon_barrier(tbon_daemon d, uint64_t id, uint32_t timeout_ms);

// Posts a receive for messages from `peer` (a rank, or `TBON_RANK_ANY`) with `tag`. `cb` (not
// NULL) runs on the loop thread for each match: once if `persistent` is 0, else until
// `tbon_cancel`. Messages that arrived before the post are held (bounded) and matched now. A
// receive for a rank wins over one for `TBON_RANK_ANY` with the same tag. Errors:
// `TBON_ERR_DUPLICATE` (same peer and tag already posted), `TBON_ERR_RESERVED_TAG`,
// `TBON_ERR_RANK_OUT_OF_RANGE`, `TBON_ERR_SHUT_DOWN`.
tbon_rc tbon_recv(tbon_daemon d,
                  uint32_t peer,
                  uint32_t tag,
                  int persistent,
                  tbon_recv_cb cb,
                  void *user);

// Cancels the receive posted for exactly (`peer`, `tag`); `TBON_OK` also if there was none. A
// callback already running may finish; no new match starts after the loop handles the cancel.
// `TBON_ERR_RANK_OUT_OF_RANGE` for a `peer` that is neither a rank of the DVM nor
// `TBON_RANK_ANY` (as `tbon_recv` answers).
tbon_rc tbon_cancel(tbon_daemon d, uint32_t peer, uint32_t tag);

// Drops every receive posted for rank `peer` and every message held from it.
// `TBON_ERR_RANK_OUT_OF_RANGE` for a `peer` that is not a rank of the DVM (`TBON_RANK_ANY`
// included: purge names one rank).
tbon_rc tbon_purge(tbon_daemon d, uint32_t peer);

// Waits up to `timeout_ms` for one message from `peer` (or `TBON_RANK_ANY`) with `tag`, for
// callers without callbacks, and copies its payload into `buf`. `*len` is the size of `buf` on
// entry and the message's full length on return. `*origin` (if `origin` is not NULL) gets the
// sender. If the message is longer than the buffer, the first `*len`-on-entry bytes are copied,
// the rest is discarded (the message is consumed, as MPI truncates) and `TBON_ERR_TOO_LARGE`
// is returned with the required length in `*len`: size `buf` for `msg_max_bytes` if in doubt.
// `buf` may be NULL only if `*len` is 0. Errors: `TBON_ERR_TIMED_OUT`, `TBON_ERR_DUPLICATE`
// (a receive for this peer and tag is posted), `TBON_ERR_SHUT_DOWN`, argument errors as
// `tbon_recv`. Not from a callback (`TBON_ERR_BUSY`). The receive is posted and withdrawn by
// the daemon's loop thread (so that a message matched as the time runs out is not lost): while
// a callback holds that thread, the call returns only once the callback has (keep callbacks
// short).
tbon_rc tbon_recv_blocking(tbon_daemon d,
                           uint32_t peer,
                           uint32_t tag,
                           uint32_t timeout_ms,
                           void *buf,
                           size_t *len,
                           uint32_t *origin);

// Registers a fault handler (see `tbon_fault_cb`); handlers run in registration order, after
// tbon has re-routed or failed what was queued for the dead ranks. `cb` must not be NULL.
tbon_rc tbon_on_fault(tbon_daemon d, tbon_fault_cb cb, void *user);

// Registers a repair handler (see `tbon_repair_cb`): like `tbon_on_fault`, and it also tells
// the ranks back in the tree (rejoined or joined) and those that left in order. Handlers of
// both kinds run in registration order. `TBON_ERR_BAD_PARAM` if `cb` is NULL.
tbon_rc tbon_on_repair(tbon_daemon d, tbon_repair_cb cb, void *user);

// Fills `*out` with a snapshot of this daemon's counters (a round trip to the loop thread).
// Not from a callback (`TBON_ERR_BUSY`).
tbon_rc tbon_counters_get(tbon_daemon d, tbon_counters *out);

// Opens `job` for client processes on daemon `d`, with a fresh random key, and writes the key
// as 64 hexadecimal digits and a NUL into `key_hex` (`TBON_CLIENT_KEY_HEX_SIZE` bytes). Give
// the processes of the job the key, the job's number and the daemon's socket
// (`tbon_client_socket_path`), for example as the variables `tbon_client_from_env` reads
// (`TBON_CLIENT_SOCKET`, `TBON_CLIENT_JOB`, `TBON_CLIENT_KEY`); keep the key private. The
// job's clients may message only clients of `job`, and clients of the `n_accept` jobs at
// `accept_from` (NULL when `n_accept` is 0; copied) may message them (each receiver's own
// daemon decides). Opening a job again makes a new key (clients admitted stay) and replaces
// the list. The job is open once this returns: its processes may connect at once.
//
// Errors: `TBON_ERR_NO_SOCKET` (the daemon's `client_socket` setting is unset),
// `TBON_ERR_BUSY` (1,024 jobs open on this daemon; or from a callback: this call waits for
// the daemon's loop), `TBON_ERR_SHUT_DOWN`, `TBON_ERR_BAD_PARAM` (`key_hex` NULL,
// `accept_from` NULL with `n_accept` > 0), `TBON_ERR_TOO_LARGE` (`n_accept` above 1,024,
// `CLIENT_ACCEPT_FROM_MAX`: nothing is read), `TBON_ERR_BAD_HANDLE`.
tbon_rc tbon_client_job(tbon_daemon d,
                        uint64_t job,
                        const uint64_t *accept_from,
                        size_t n_accept,
                        char *key_hex);

// `tbon_client_job` with the key the caller chose (`key_hex`: 64 hexadecimal digits,
// NUL-terminated): a resource manager that starts one job's processes on many nodes gives
// every daemon of the job the same key, so that one environment serves every process. Make
// the key from 32 bytes of a cryptographic random source (`tbon keygen FILE` writes one).
// Errors as `tbon_client_job`, and `TBON_ERR_BAD_PARAM` for a key that is not 64
// hexadecimal digits.
tbon_rc tbon_client_job_with_key(tbon_daemon d,
                                 uint64_t job,
                                 const char *key_hex,
                                 const uint64_t *accept_from,
                                 size_t n_accept);

// Copies the path of daemon `d`'s client socket (its `client_socket` setting), NUL-terminated,
// into `buf`, as `tbon_contact_uri` does: `*len` is the size of `buf` on entry and the size
// needed on return; `TBON_ERR_TOO_LARGE` (nothing copied) if `buf` is too small or NULL.
// `TBON_ERR_NO_SOCKET` if the setting is unset. Answers also once the daemon stopped.
tbon_rc tbon_client_socket_path(tbon_daemon d, char *buf, size_t *len);

// No new client of `job` is admitted on daemon `d` (its clients connected stay until they
// exit). `TBON_OK` also for a job never opened, and once the daemon stopped (nothing is left
// to close). `TBON_ERR_BUSY` from a callback when the command queue is full.
tbon_rc tbon_client_job_close(tbon_daemon d, uint64_t job);

// `job` is over on daemon `d` (its processes were killed, say): no new client is admitted,
// and every client of the job connected to `d` is disconnected (its `tbon_client_daemon_lost`
// reason says "job J ended" when the notice reached it); whoever watches them is told
// `TBON_CLIENT_EXITED`. `TBON_OK` also for a job never opened, and once the daemon stopped.
// `TBON_ERR_BUSY` from a callback when the command queue is full.
tbon_rc tbon_client_job_end(tbon_daemon d, uint64_t job);

// Connects to the daemon's client socket at `socket` as a process of `job` holding its key
// (`key_hex`, 64 hexadecimal digits, as `tbon_client_job` wrote it) and stores the client's
// handle in `*out`. Waits for the daemon's answer (at most 10 s). Errors:
// `TBON_ERR_REFUSED` (the daemon did not admit it: wrong key, job not open, uid not in
// `client_uids`, too many clients; its reason in `tbon_last_error`), `TBON_ERR_UNREACHABLE`
// (no daemon at `socket`, or it broke the protocol; the cause in `tbon_last_error`),
// `TBON_ERR_BAD_PARAM` (NULL or non-UTF-8 `socket`, a bad key, NULL `out`), `TBON_ERR_BUSY`
// (from a callback).
tbon_rc tbon_client_connect(const char *socket,
                            uint64_t job,
                            const char *key_hex,
                            tbon_client *out);

// `tbon_client_connect` with what the environment holds: `TBON_CLIENT_SOCKET`,
// `TBON_CLIENT_JOB` (the job's number) and `TBON_CLIENT_KEY` (its key, 64 hexadecimal
// digits), what a resource manager sets for the processes it starts. `TBON_ERR_CONFIG` when
// one is unset or malformed (its name in `tbon_last_error`); otherwise as
// `tbon_client_connect`.
tbon_rc tbon_client_from_env(tbon_client *out);

// Closes client `c` and frees its handle; 0 does nothing (`TBON_OK`). Its daemon removes it,
// and the clients watching it are told `TBON_CLIENT_EXITED`. Calls on `c` in progress on
// other threads end first (a wait ends `TBON_ERR_DAEMON_LOST` within 50 ms); then the
// connection closes. Close does not flush: sends it accepted and the daemon has not yet
// answered may never be delivered; to be sure they were, wait for their callbacks (or use
// `tbon_client_send_wait`) before closing. The callbacks of sends still unanswered get
// `TBON_ERR_DAEMON_LOST` and
// the daemon-lost callbacks run, on the client's thread, before this returns. Afterwards no
// callback of `c` runs any more: the safe point to free their `user` data. From a callback,
// this does not wait: the connection closes once the calls on `c` in progress returned, and
// those last callbacks may run after this returns (after the calling callback, when it is
// one of `c`'s). `TBON_ERR_BAD_HANDLE` if `c` is not a client (or was closed already).
tbon_rc tbon_client_close(tbon_client c);

// Stores client `c`'s name in `*rank` (its daemon's rank) and `*local` (its id at that
// daemon, from 1, never reused while the daemon runs); either may be NULL.
tbon_rc tbon_client_name(tbon_client c, uint32_t *rank, uint32_t *local);

// Stores the DVM's size in `*size` (client names have ranks below it).
tbon_rc tbon_client_size(tbon_client c, uint32_t *size);

// Stores in `*max` the largest payload client `c` may send (the DVM's `msg_max_bytes` less
// the 28-byte header a client message carries between daemons): a buffer that large receives
// any message.
tbon_rc tbon_client_msg_max(tbon_client c, size_t *max);

// Sends `len` bytes at `data` (COPIED before this returns; NULL when `len` is 0) with `tag`
// (at least `TBON_TAG_USER_MIN`) to client (`rank`, `local`). Messages from one client to
// another arrive in the order sent, each once. `cb` (may be NULL) is called exactly once,
// on the client's thread, if and only if this returns `TBON_OK`: `TBON_OK` once the
// receiver's daemon has queued the message for the receiver, or why it never will be:
// `TBON_ERR_UNKNOWN_CLIENT` (no such client was ever admitted, or the rank is not in the
// DVM), `TBON_ERR_NOT_PERMITTED` (the receiver's job does not accept this client's),
// `TBON_ERR_CLIENT_GONE` (the receiver exited), `TBON_ERR_NODE_DOWN` (the receiver's daemon
// died before answering: the message may or may not have arrived), `TBON_ERR_DAEMON_LOST`
// (this client's daemon is gone, or this client was closed).
//
// Waits while `TBON_CLIENT_SENDS_INFLIGHT_MAX` sends are unanswered (from a callback:
// `TBON_ERR_BUSY` instead). Returned at once: `TBON_ERR_RESERVED_TAG`, `TBON_ERR_TOO_LARGE`
// (above `tbon_client_msg_max`), `TBON_ERR_DAEMON_LOST`, `TBON_ERR_BAD_PARAM`,
// `TBON_ERR_BAD_HANDLE`.
tbon_rc tbon_client_send(tbon_client c,
                         uint32_t rank,
                         uint32_t local,
                         uint32_t tag,
                         const void *data,
                         size_t len,
                         tbon_send_cb cb,
                         void *user);

// `tbon_client_send` that never waits: `TBON_ERR_BUSY` (nothing sent, `cb` not called) while
// `TBON_CLIENT_SENDS_INFLIGHT_MAX` sends are unanswered.
tbon_rc tbon_client_try_send(tbon_client c,
                             uint32_t rank,
                             uint32_t local,
                             uint32_t tag,
                             const void *data,
                             size_t len,
                             tbon_send_cb cb,
                             void *user);

// Sends as `tbon_client_send` and waits for the result, at most `timeout_ms`
// (`TBON_WAIT_FOREVER`: no limit): the code `cb` would get, or `TBON_ERR_TIMED_OUT` (the
// message may still be delivered), or an error returned at once. Not from a callback
// (`TBON_ERR_BUSY`).
tbon_rc tbon_client_send_wait(tbon_client c,
                              uint32_t rank,
                              uint32_t local,
                              uint32_t tag,
                              const void *data,
                              size_t len,
                              uint32_t timeout_ms);

// Waits up to `timeout_ms` (`TBON_WAIT_FOREVER`: no limit) for a message from client
// (`from_rank`, `from_local`) (both `TBON_CLIENT_ANY`: any client) with `tag`
// (`TBON_TAG_ANY`: any tag), and copies its payload into `buf` (`cap` bytes). `*len` (`len`
// not NULL) gets the payload's length; `*from_rank`, `*from_local` and `*tag_out` (each may
// be NULL) the sender and the tag. Messages from one sender come in the order it sent them.
// Messages a posted receive (`tbon_client_recv_cb`) matches never come here.
//
// A message longer than `cap` is NOT consumed: `TBON_ERR_TOO_LARGE` with its length, sender
// and tag stored, nothing copied, and the message set aside for this client: the next
// receive (this call or `tbon_client_recv_cb`) that matches it gets it before any other. So
// `buf` NULL with `cap` 0 asks the next message's length; a buffer of `tbon_client_msg_max`
// bytes takes any message. `buf` may be NULL only when `cap` is 0.
//
// Errors: `TBON_ERR_TIMED_OUT` (nothing taken), `TBON_ERR_DAEMON_LOST` (the daemon is gone
// and nothing matching is left, or the client was closed), `TBON_ERR_BUSY`
// (`TBON_CLIENT_UNMATCHED_MAX` messages set aside and none matches; or from a callback),
// `TBON_ERR_BAD_PARAM` (`len` NULL, `buf` NULL with `cap` > 0, one wildcard of the two),
// `TBON_ERR_BAD_HANDLE`.
tbon_rc tbon_client_recv(tbon_client c,
                         uint32_t from_rank,
                         uint32_t from_local,
                         uint32_t tag,
                         void *buf,
                         size_t cap,
                         size_t *len,
                         uint32_t *from_rank_out,
                         uint32_t *from_local_out,
                         uint32_t *tag_out,
                         uint32_t timeout_ms);

// Posts a receive: `cb` (not NULL) gets each message from client (`from_rank`, `from_local`)
// (both `TBON_CLIENT_ANY`: any) with `tag` (`TBON_TAG_ANY`: any), once if `persistent` is 0,
// else every one until `tbon_client_cancel`. Messages already held (those set aside by
// `tbon_client_recv` first) are matched at once, on the calling thread before this returns;
// later ones on the client's thread. Posted receives are tried in the order posted.
// `*id` (if `id` is not NULL) gets the receive's id for `tbon_client_cancel`. Errors:
// `TBON_ERR_BUSY` (`TBON_CLIENT_RECEIVES_MAX` receives posted), `TBON_ERR_BAD_PARAM` (a NULL
// `cb`, one wildcard of the two), `TBON_ERR_DAEMON_LOST` (the client was closed),
// `TBON_ERR_BAD_HANDLE`. A receive posted once the daemon is gone stays posted, unmatched.
tbon_rc tbon_client_recv_cb(tbon_client c,
                            uint32_t from_rank,
                            uint32_t from_local,
                            uint32_t tag,
                            int persistent,
                            tbon_client_msg_cb cb,
                            void *user,
                            uint64_t *id);

// Withdraws the receive `id` posted on client `c` (`tbon_client_recv_cb`); `TBON_OK` also if
// it is gone (a one-shot receive that matched, an unknown id). A callback already running
// finishes.
tbon_rc tbon_client_cancel(tbon_client c, uint64_t id);

// `cb` (not NULL) runs once, on the client's thread, when client (`rank`, `local`) exits
// (`TBON_CLIENT_EXITED`), when its daemon dies (`TBON_CLIENT_DAEMON_DIED`), or, through the
// daemon, at once if it is not alive: `TBON_CLIENT_EXITED` if it had exited,
// `TBON_CLIENT_UNKNOWN` if it never was. Any client may watch any other, of any job.
// Errors: `TBON_ERR_BUSY` (`TBON_CLIENT_RECEIVES_MAX` names watched),
// `TBON_ERR_DAEMON_LOST` (this client's daemon is gone, or the client was closed; `cb` is
// then never called), `TBON_ERR_BAD_PARAM`, `TBON_ERR_BAD_HANDLE`.
tbon_rc tbon_client_watch(tbon_client c,
                          uint32_t rank,
                          uint32_t local,
                          tbon_client_watch_cb cb,
                          void *user);

// Whether client `c`'s connection to its daemon ended (the daemon died or stopped, or broke
// the protocol): `*lost` 1 or 0. If `len` is not NULL, also why, as `tbon_stop_reason` gives
// its text: `*len` is the buffer's size on entry and the size the text needs (with its NUL;
// "" while connected) on return; with `buf` NULL that is all, else the text is copied, or
// `TBON_ERR_TOO_LARGE` if it does not fit (`*lost` is stored all the same). Never blocks.
tbon_rc tbon_client_daemon_lost(tbon_client c, int *lost, char *buf, size_t *len);

// `cb` (not NULL) runs once when client `c`'s connection to its daemon ends, with why: on the
// client's thread (also during `tbon_client_close`), or at once on this thread if it has
// ended already. Receives and sends then fail `TBON_ERR_DAEMON_LOST`; the client cannot
// reconnect (close it and connect anew once a daemon serves the socket again).
tbon_rc tbon_client_on_daemon_lost(tbon_client c, tbon_client_lost_cb cb, void *user);

// Makes a group of the `nmembers` ranks at `members` (any order; duplicates count once) under
// `context`, and stores its handle in `*out`. A group is what one job's collectives run
// among: only its members take part (and the daemons of the tree between them and rank 0),
// and any number of groups, overlapping or not, run at once.
//
// What the caller must do: every member's daemon makes its own group with the same
// `context` and members (a group belongs to the daemon that first uses it: one group per
// daemon, also for several daemons in one process, else `TBON_ERR_BAD_PARAM`); every living
// member calls the group's collectives in the same order, the same kind each time
// (allgather, barrier, or broadcast with the same root), since a group numbers its
// collectives 0, 1, 2, ... in the order they are called; calls from several threads are
// ordered by the caller; a context is never used again for the same members once a group
// was used (a job's number is never reused). Whether the ranks exist is checked when the
// group is used (`TBON_ERR_RANK_OUT_OF_RANGE`). Errors: `TBON_ERR_BAD_PARAM` (no members,
// `members` NULL with `nmembers` > 0, `out` NULL), `TBON_ERR_TOO_LARGE` (more than
// `TBON_GROUP_MEMBERS_MAX` members). The members are copied.
tbon_rc tbon_group_new(uint64_t context, const uint32_t *members, size_t nmembers, tbon_group *out);

// Frees group `g`; 0 does nothing (`TBON_OK`). Collectives already called go on, and their
// callbacks still run. `TBON_ERR_BAD_HANDLE` if `g` is not a group (or was freed already).
tbon_rc tbon_group_free(tbon_group g);

// Stores in `*out` the number the group's next collective will take: how many of its
// collectives this daemon called and had accepted (a call refused at once takes none).
// `TBON_ERR_BUSY` from a callback while another thread's call on this group is in progress.
tbon_rc tbon_group_next_seq(tbon_group g, uint64_t *out);

// Contributes `len` bytes at `data` (copied; `data` may be NULL when `len` is 0) to group
// `g`'s next collective, an allgather, without waiting. `cb` (not NULL) gets the result as
// `tbon_allgather_cb` describes, the same at every member: every member's bytes ordered by
// rank (members only), the members that died before theirs reached the tree as excluded,
// and `id` set to the collective's number in the group. It is called exactly once if and
// only if this returns `TBON_OK`; then with `TBON_OK`, or `TBON_ERR_TOO_LARGE` (the gathered
// bytes exceeded 16 MiB, 8 bytes per member included, or `msg_max_bytes`),
// `TBON_ERR_DUPLICATE` (another group of the same context and members ran this number on
// this daemon), `TBON_ERR_MISMATCH` (the members called different collectives under this
// number), `TBON_ERR_RESULT_LOST` (see `tbon_rc`; the other members may have it),
// `TBON_ERR_SHUT_DOWN` (the daemon stopped first).
//
// Returned at once, and then the call takes no number (call it again later to stay in step
// with the other members): `TBON_ERR_NOT_MEMBER` (this daemon is not a member),
// `TBON_ERR_RANK_OUT_OF_RANGE` (a member is not a rank of the DVM), `TBON_ERR_TOO_LARGE`
// (above 16 MiB less 13 bytes), `TBON_ERR_BUSY` (`TBON_GROUP_INFLIGHT_MAX` group collectives
// in flight on this daemon, or the queue before wire-up is full; from a callback also when
// the command queue is, or when another thread's call on this group is in progress), `TBON_ERR_SHUT_DOWN`, `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM` (a NULL
// `cb` or `data`, or a group bound to another daemon). A barrier that does not wait is this
// call with `len` 0.
tbon_rc tbon_group_allgather(tbon_daemon d,
                             tbon_group g,
                             const void *data,
                             size_t len,
                             tbon_allgather_cb cb,
                             void *user);

// Enters group `g`'s next collective, a barrier, and waits until every living member has
// entered it (members that died are not waited for), or `timeout_ms` passed
// (`TBON_ERR_TIMED_OUT`: this daemon stays entered, the barrier goes on and keeps its
// number). Errors as `tbon_group_allgather` (returned here, whether at once or at the end);
// not from a callback (`TBON_ERR_BUSY`). To enter without waiting, call
// `tbon_group_allgather` with `len` 0.
tbon_rc tbon_group_barrier(tbon_daemon d, tbon_group g, uint32_t timeout_ms);

// Group `g`'s next collective as a broadcast from member `root`, without waiting: every
// living member calls it with the same `root`; the root's `len` bytes at `data` (copied; NULL
// when `len` is 0) go to every member, and `cb` (not NULL) gets them (see
// `tbon_group_broadcast_cb`), at the root too. At the other members `data` and `len` are not
// read (pass NULL and 0). `cb` is called exactly once if and only if this returns `TBON_OK`.
// Returned at once: `TBON_ERR_NOT_MEMBER` also when `root` is not a member; otherwise as
// `tbon_group_allgather`.
tbon_rc tbon_group_broadcast(tbon_daemon d,
                             tbon_group g,
                             uint32_t root,
                             const void *data,
                             size_t len,
                             tbon_group_broadcast_cb cb,
                             void *user);

// Stages `len` bytes at `value` (copied; NULL when `len` is 0) under `key` for group `g` on
// daemon `d`: this daemon's data for the job (a later put of the same key replaces the
// value). Nothing leaves the daemon, and no other member can read it, until `tbon_commit`.
//
// What the caller must do: `d` is a member of `g`; `key` is NUL-terminated UTF-8 of at most
// `TBON_MODEX_KEY_MAX` bytes. Errors, and then nothing is staged: `TBON_ERR_NOT_MEMBER`,
// `TBON_ERR_RANK_OUT_OF_RANGE` (a member of `g` is not a rank of the DVM),
// `TBON_ERR_BAD_PARAM` (`key` NULL, not UTF-8 or too long; `value` NULL with `len` > 0; a
// group bound to another daemon), `TBON_ERR_TOO_LARGE` (the group's data on this daemon, its
// keys and values with 6 bytes more per value, would exceed what a full fence can gather of
// one member: just under 16 MiB),
// `TBON_ERR_BUSY` (data for `TBON_MODEX_GROUPS_MAX` groups here: `tbon_forget_group` one),
// `TBON_ERR_SHUT_DOWN`, `TBON_ERR_BAD_HANDLE`.
tbon_rc tbon_put(tbon_daemon d, tbon_group g, const char *key, const void *value, size_t len);

// Commits everything put for group `g` on daemon `d` so far, replacing what it committed
// before: other members can now get it (a get after a direct fence fetches what is committed
// when its request arrives), and a full fence gathers it. Commit before entering the fence
// that the others' gets follow; a member with nothing put commits an empty set (its keys are
// then `TBON_ERR_NOT_FOUND`). A daemon that already holds this daemon's data for the group (a
// full fence's, or a fetch's) answers from it until the next fence of the group, which
// starts a new round: commit again, then fence, and the others see the new data. Errors:
// `TBON_ERR_NOT_MEMBER`, `TBON_ERR_RANK_OUT_OF_RANGE` (a member of `g` is not a rank of the
// DVM), `TBON_ERR_BUSY` (`TBON_MODEX_GROUPS_MAX` groups with data here; from
// a callback also when the command queue is full), `TBON_ERR_SHUT_DOWN`,
// `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM` (a group bound to another daemon).
tbon_rc tbon_commit(tbon_daemon d, tbon_group g);

// The job of group `g` is over on daemon `d`: what it put and committed for the group and what
// it cached of the other members' data are dropped (gets for the group then find nothing
// here; other members' fetches from it end `TBON_ERR_NOT_FOUND`). It frees a place of
// `TBON_MODEX_GROUPS_MAX`. The group handle stays valid (`tbon_group_free` frees it). Cleanup:
// `TBON_OK` also when `d` is not a member, and once the daemon stopped (nothing is left).
// Errors: `TBON_ERR_BUSY` from a callback when the command queue is full (call it again);
// `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM` (a group bound to another daemon).
tbon_rc tbon_forget_group(tbon_daemon d, tbon_group g);

// Enters group `g`'s next collective, a fence of the data exchange in `mode` (a
// `tbon_fence_mode` value), and waits until every living member has entered it (members that
// died are not waited for), or `timeout_ms` passed (`TBON_ERR_TIMED_OUT`: this daemon stays
// entered, the fence goes on and keeps its number). With `TBON_FENCE_FULL` every member's
// committed data is here once this returns `TBON_OK`, replacing what this daemon held of the
// group (unless all of it, 13 bytes per member included, exceeded 16 MiB: then the fence
// carries none, and gets fetch it as after a direct fence); with `TBON_FENCE_DIRECT` what
// this daemon held of the group is dropped, and gets fetch it again. Every fence thus starts
// a new round: a get after it sees what the owner had committed when it entered it.
//
// What the caller must do: commit first (`tbon_commit`); every member fences with the same
// mode, in the same order as the group's other collectives (a fence takes the group's next
// number, like `tbon_group_barrier`; members that differ all end it `TBON_ERR_MISMATCH`); no
// member commits again until every member has read what it needs of this round (another
// fence tells). Which members were excluded: `tbon_fence_cb`. Errors as `tbon_group_barrier`,
// and `TBON_ERR_BAD_PARAM` for another `mode`; not from a callback (`TBON_ERR_BUSY`).
tbon_rc tbon_fence(tbon_daemon d, tbon_group g, int mode, uint32_t timeout_ms);

// `tbon_fence` without waiting: `cb` (not NULL) gets the outcome (see `tbon_fence_done_cb`),
// exactly once if and only if this returns `TBON_OK`. Returned at once, and then the call
// takes no number: the errors `tbon_group_allgather` returns at once, and
// `TBON_ERR_BAD_PARAM` for a NULL `cb` or another `mode`. May be called from a callback.
tbon_rc tbon_fence_cb(tbon_daemon d, tbon_group g, int mode, tbon_fence_done_cb cb, void *user);

// Reads the value member `rank` committed under `key` for group `g`, waiting up to
// `timeout_ms`, and copies it into `buf` (`cap` bytes): from this daemon's cache (a full
// fence's, or an earlier fetch's), from its own committed data, or fetched from `rank` (all of
// its data for the group at once, then cached until the group's next fence; least recently
// used out first). Call it after the fence that followed the owner's commit. Values are
// bytes, not strings: no NUL is added.
//
// `*len` (`len` not NULL) gets the value's length with `TBON_OK` and with
// `TBON_ERR_TOO_LARGE`; it is left alone otherwise. A value longer than `cap` is
// `TBON_ERR_TOO_LARGE` with nothing copied, as `tbon_contact_uri` answers: `buf` NULL with
// `cap` 0 asks the length, then a second call with a buffer that large reads the value (from
// the cache when the first one fetched it). `buf` may be NULL only when `cap` is 0.
//
// Errors: `TBON_ERR_NOT_FOUND` (`rank` never put `key` for the group, or had not committed
// it when its data was taken: at a full fence, or when the fetch's request reached it after
// a direct one), `TBON_ERR_NODE_DOWN` (`rank` is dead, or died before its data came; never a
// hang), `TBON_ERR_NOT_MEMBER` (this daemon is not a member of the group: only members read a
// job's data; or `rank` is not), `TBON_ERR_RANK_OUT_OF_RANGE` (`rank`, or a member of the
// group, is not a rank of the DVM), `TBON_ERR_BAD_PARAM` (`key`
// NULL, not UTF-8 or longer than `TBON_MODEX_KEY_MAX`; `len` NULL; `buf` NULL with `cap` > 0;
// a group bound to another daemon), `TBON_ERR_TIMED_OUT` (the fetch goes on and fills the
// cache), `TBON_ERR_BUSY` (`TBON_MODEX_FETCHES_MAX` fetches in flight here; or from a
// callback: this call blocks, use `tbon_get_cb`), `TBON_ERR_CORRUPT` (`rank`'s data came back
// malformed; logged), `TBON_ERR_SHUT_DOWN`, `TBON_ERR_BAD_HANDLE`.
tbon_rc tbon_get(tbon_daemon d,
                 tbon_group g,
                 uint32_t rank,
                 const char *key,
                 void *buf,
                 size_t cap,
                 size_t *len,
                 uint32_t timeout_ms);

// `tbon_get` without waiting: `cb` (not NULL) gets the value or why not (see
// `tbon_get_done_cb`), exactly once if and only if this returns `TBON_OK`, on the loop thread
// (possibly before this returns). Returned at once:
// `TBON_ERR_NOT_MEMBER` (as `tbon_get`), `TBON_ERR_BAD_PARAM` (as `tbon_get`, or a NULL `cb`),
// `TBON_ERR_BUSY` (from a callback: the command queue is full), `TBON_ERR_SHUT_DOWN`,
// `TBON_ERR_BAD_HANDLE`. May be called from a callback, also for the same group.
tbon_rc tbon_get_cb(tbon_daemon d,
                    tbon_group g,
                    uint32_t rank,
                    const char *key,
                    tbon_get_done_cb cb,
                    void *user);

// Gathers the status of the subtree of daemon `d` of this process (rank 0: the whole DVM)
// within `budget_ms` (1 to 60,000, a longer one cut to 60,000; 0 is `TBON_ERR_BAD_PARAM`; a subtree silent for longer shows as
// `TBON_RANK_NO_ANSWER`), and stores a new handle in `*out`. Blocks for about the budget at
// most; `TBON_ERR_BUSY` from a callback, before wire-up, or with 8 queries of this daemon in
// progress; `TBON_ERR_SHUT_DOWN` once it stops; `TBON_ERR_BAD_PARAM` for unknown `flags`.
tbon_rc tbon_status_get(tbon_daemon d,
                        uint32_t budget_ms,
                        uint32_t flags,
                        tbon_status *out);

// As an operator's tool: connects to the daemon whose contact URI is `uri` (rank 0's, from
// its `--uri-file`, for the whole DVM), proves the operator credential in the file
// `credential_path` (`tbon_operator_credential`, `tbon keygen --operator`), and gathers its
// subtree's status within `budget_ms` (1 to 60,000); a new handle in `*out`. Never joins the
// DVM. Blocks for at most 5 s to connect and complete the handshake, then the budget plus
// 5 s for the answer. `TBON_ERR_CREDENTIAL` when the daemon does not hold the key the
// credential derives from; `TBON_ERR_UNREACHABLE` (no answer to the connection, or a
// handshake not completed in time: a stopped daemon); `TBON_ERR_BUSY` (not wired up,
// stopping, busy, or it closed the connection during the handshake: too many tools, or a
// URI naming another DVM or rank); `TBON_ERR_TIMED_OUT`, `TBON_ERR_SHUT_DOWN`;
// `TBON_ERR_CONFIG` for a credential file that cannot be read; `TBON_ERR_BAD_PARAM` for a
// bad URI, flags or a zero budget.
tbon_rc tbon_status_query(const char *uri,
                          const char *credential_path,
                          uint32_t budget_ms,
                          uint32_t flags,
                          tbon_status *out);

// Writes the operator credential derived from the job key in `key_path` to a new file at
// `out_path` (mode 0600; never replaces a file), as `tbon keygen --operator` does: give it to
// operators' tools instead of the job key. `TBON_ERR_CONFIG` if the key cannot be read or the
// file cannot be created; `TBON_ERR_BAD_PARAM` for a NULL or non-UTF-8 path.
tbon_rc tbon_operator_credential(const char *key_path, const char *out_path);

// Stores the counts of status `s` in `*out`.
tbon_rc tbon_status_summary(tbon_status s, tbon_status_counts *out);

// Stores what status `s` says of `rank` in `*out`; `TBON_ERR_RANK_OUT_OF_RANGE` for a rank
// beyond the DVM's size.
tbon_rc tbon_status_rank(tbon_status s, uint32_t rank, tbon_rank_state *out);

// Stores `rank`'s wall-clock offset from the daemon that gathered status `s` (its clock minus
// that daemon's, ns) in `*offset_ns`, and the bound within which the true offset lies in
// `*bound_ns`: measured hop by hop along the tree by the query itself (NTP's four timestamps
// per hop). Offsets are known for the daemons the status shows in detail: ask with
// `TBON_STATUS_ALL` to have every daemon's. `TBON_ERR_NODE_DOWN` when the status has no offset
// for `rank` (not in detail, silent, dead, or a hop without a sample);
// `TBON_ERR_RANK_OUT_OF_RANGE` beyond the DVM's size.
tbon_rc tbon_status_clock(tbon_status s, uint32_t rank, int64_t *offset_ns, uint64_t *bound_ns);

// Copies status `s` as JSON (the shape of `tbon status --format json`, without `took_us`),
// NUL-terminated, into `buf`: `*len` is the size of `buf` on entry and the size needed on
// return; if it does not fit (or `buf` is NULL, to ask the size) nothing is copied and
// `TBON_ERR_TOO_LARGE` is returned. The status does not change between calls.
tbon_rc tbon_status_json(tbon_status s, char *buf, size_t *len);

// Frees status `s`; `TBON_ERR_BAD_HANDLE` if it is not one (or was freed already).
tbon_rc tbon_status_free(tbon_status s);

// Offers `service` (a NUL-terminated name of at most 255 bytes) to consumers: `cb` runs on a
// thread of its own for every stream opened (see `tbon_serve_cb`), with `user`, which must
// be usable from those threads and stay alive until the daemon's stop (`tbon_shutdown`,
// `tbon_shutdown_dvm`, `tbon_abort`, `tbon_free`) has returned: a stop waits for every
// service callback still running to return (their writers fail `TBON_ERR_SHUT_DOWN`, and a
// callback must then return). Serving a name again
// replaces its callback for new streams. Errors: `TBON_ERR_TOO_LARGE` (the name),
// `TBON_ERR_BUSY` (256 services already), `TBON_ERR_SHUT_DOWN`.
tbon_rc tbon_serve(tbon_daemon d, const char *service, tbon_serve_cb cb, void *user);

// Writes `len` bytes of `data` (copied) on the stream, waiting for the consumer's credit as
// needed, at most `timeout_ms` in all (`TBON_WAIT_FOREVER`: no limit). `*written` (if not
// NULL) gets the bytes taken, also on an error. `TBON_ERR_TIMED_OUT`: the time ran out with
// `*written` < `len`; write the rest later. The stream's end: `TBON_ERR_CANCELLED` (the
// consumer gave it up, or moved it to a new stream: the service is called again for the
// rest), `TBON_ERR_PEER_DIED`, `TBON_ERR_CORRUPT`, `TBON_ERR_SHUT_DOWN`: stop producing.
// `TBON_ERR_TOO_LARGE`: no memory for the copy of `len` bytes (nothing taken; write less at a
// time, or use `tbon_writer_write_nocopy`). One thread at a time per writer.
tbon_rc tbon_writer_write(tbon_writer w,
                          const void *data,
                          size_t len,
                          uint32_t timeout_ms,
                          size_t *written);

// `tbon_writer_write` without the copy: tbon reads `len` bytes at `data` in place (its
// chunks are sliced from them), and calls `free_cb(data, free_user)` exactly once when it no
// longer needs them, WHATEVER this call returns (on an argument error, before it returns), on
// any thread. Until then the buffer must stay valid and unmodified: that may be after this
// call returns (the last chunks are still on their way). `free_cb` must not be NULL
// (`TBON_ERR_BAD_PARAM`, and then it is not called). Otherwise as `tbon_writer_write`.
tbon_rc tbon_writer_write_nocopy(tbon_writer w,
                                 void *data,
                                 size_t len,
                                 tbon_free_cb free_cb,
                                 void *free_user,
                                 uint32_t timeout_ms,
                                 size_t *written);

// Bytes the writer may write now without waiting (`*room`; 0: wait for credit), or the
// stream's end as in `tbon_writer_write`.
tbon_rc tbon_writer_room(tbon_writer w, uint64_t *room);

// Ends the stream: the consumer reads its end (`TBON_OK`, 0 bytes) once every byte written
// has arrived and checked. The writer is invalid afterwards, also on an error (the stream's
// end, as in `tbon_writer_write`).
tbon_rc tbon_writer_finish(tbon_writer w);

// Fails the stream with `code` (below `TBON_STREAM_FAIL_RESERVED_MIN`) and `reason` (may be
// NULL; at most 1024 bytes are sent): the consumer reads `TBON_ERR_STREAM_FAILED` with both.
// The writer is invalid afterwards, also on an error: a reserved `code` or a `reason` that is
// not UTF-8 (`TBON_ERR_BAD_PARAM`) fails the stream as a dropped writer does
// (`TBON_STREAM_FAIL_ABANDONED`).
tbon_rc tbon_writer_fail(tbon_writer w, uint32_t code, const char *reason);

// Fetches `request` (`len` bytes, copied; at most 64 KiB) from `service` at `producer` and
// stores the stream in `*out`; read it with `tbon_stream_read`, then `tbon_stream_close` it.
// `opts` may be NULL (every default; see `tbon_fetch_opts`). Errors: `TBON_ERR_BAD_PARAM` (a
// bad route), `TBON_ERR_RANK_OUT_OF_RANGE`, `TBON_ERR_TOO_LARGE`,
// `TBON_ERR_NODE_DOWN` (the producer is known dead), `TBON_ERR_BUSY` (1024 streams already),
// `TBON_ERR_SHUT_DOWN`. What happens at the producer is read as the stream's end.
tbon_rc tbon_fetch(tbon_daemon d,
                   uint32_t producer,
                   const char *service,
                   const void *request,
                   size_t len,
                   const tbon_fetch_opts *opts,
                   tbon_stream *out);

// Reads the stream's next bytes into `buf` (`cap` bytes), waiting at most `timeout_ms`
// (`TBON_WAIT_FOREVER`: until bytes or the end come, never longer than the stream's idle
// time). `TBON_OK` with `*got` > 0: bytes, in order. `TBON_OK` with `*got` == 0: the stream
// FINISHED, every byte arrived and checked. `cap` 0 is `TBON_ERR_BAD_PARAM` (it could not
// be told from the end). `TBON_ERR_TIMED_OUT`: nothing
// yet, read again. Otherwise the stream ended with an error (every later read returns it
// again): `TBON_ERR_NO_SERVICE`, `TBON_ERR_STREAM_FAILED` (the producer's code:
// `tbon_stream_fail_code`; `tbon_last_error` has a message with the code and the producer's
// reason), `TBON_ERR_PEER_DIED`,
// `TBON_ERR_CANCELLED`, `TBON_ERR_CORRUPT`, `TBON_ERR_IDLE` (no news for the idle time),
// `TBON_ERR_SHUT_DOWN`. Not from a callback (`TBON_ERR_BUSY`).
tbon_rc tbon_stream_read(tbon_stream s, void *buf, size_t cap, size_t *got, uint32_t timeout_ms);

// The producer's code of a stream that ended `TBON_ERR_STREAM_FAILED`, in `*code`;
// `TBON_ERR_BAD_PARAM` when the stream did not end that way (yet).
tbon_rc tbon_stream_fail_code(tbon_stream s, uint32_t *code);

// Closes the stream: cancels it if it has not ended (the producer's writer fails
// `TBON_ERR_CANCELLED`; a read blocked on another thread returns `TBON_ERR_CANCELLED`) and
// frees it. The handle is invalid afterwards.
tbon_rc tbon_stream_close(tbon_stream s);

// Fetches like `tbon_fetch`, delivering the stream to `cb` on the loop thread instead (see
// `tbon_stream_cb`); `*id` (if not NULL) gets the stream's id for `tbon_fetch_cancel`. `cb`
// runs if and only if this returns `TBON_OK`, and its last call has `end` set.
tbon_rc tbon_fetch_cb(tbon_daemon d,
                      uint32_t producer,
                      const char *service,
                      const void *request,
                      size_t len,
                      const tbon_fetch_opts *opts,
                      tbon_stream_cb cb,
                      void *user,
                      uint64_t *id);

// Cancels stream `id` of `tbon_fetch_cb`: its callback ends with `TBON_ERR_CANCELLED`
// (unless it ended first). Nothing happens for an id that ended.
tbon_rc tbon_fetch_cancel(tbon_daemon d, uint64_t id);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* TBON_H */
