//! Run-time settings of a tbon daemon, with PRRTE-like defaults.
//!
//! Every setting has one entry in the table below, which generates the [`Config`] struct,
//! [`Default`], [`Config::names`], [`Config::settings`] (each setting described for a front
//! end), the by-name setter [`Config::set`] and getter [`Config::get`]. The library reads the
//! environment only when asked ([`Config::from_env`]); [`Config::default`] reads nothing. The
//! `tbon` command builds its flags from [`Config::settings`]; its precedence is command-line
//! flag, then `TBON_<NAME>` environment variable, then the default. `docs/config.md` lists them
//! all, and every environment variable tbon reads.

use std::fmt;

use crate::limits;
use crate::oob::interfaces::IfSpec;

/// Why a setting was refused: which setting and why.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// No setting has this name.
    Unknown {
        /// The name as given.
        name: String,
    },
    /// The value could not be parsed for this setting.
    BadValue {
        /// The setting's canonical name.
        setting: &'static str,
        /// The text given.
        value: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The value parsed but is not allowed (alone or together with another setting).
    Invalid {
        /// The setting's canonical name (for a pair, the one to change).
        setting: &'static str,
        /// Why it is not allowed.
        reason: String,
    },
    /// The job key in the `TBON_KEY` environment variable is unusable.
    Key(crate::KeyError),
}

impl ConfigError {
    pub(crate) fn invalid(setting: &'static str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            setting,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Unknown { name } => write!(
                f,
                "unknown setting {name:?} (known settings: {})",
                NAMES.join(", ")
            ),
            ConfigError::BadValue {
                setting,
                value,
                reason,
            } => write!(
                f,
                "setting {setting} (TBON_{}): cannot use {value:?}: {reason}",
                setting.to_ascii_uppercase()
            ),
            ConfigError::Invalid { setting, reason } => write!(
                f,
                "setting {setting} (TBON_{}): {reason}",
                setting.to_ascii_uppercase()
            ),
            ConfigError::Key(e) => write!(f, "{}: {e}", crate::driver::key::ENV_VAR),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Key(e) => Some(e),
            _ => None,
        }
    }
}

/// Parsing a setting's value from text, the same way for `set`, `from_env` and the C API.
trait SettingValue: Sized {
    fn parse_setting(s: &str) -> Result<Self, String>;
}

macro_rules! numeric_setting {
    ($($t:ty),*) => {$(
        impl SettingValue for $t {
            fn parse_setting(s: &str) -> Result<Self, String> {
                s.trim().parse::<$t>().map_err(|e| format!("{e} (expected an integer 0..={})", <$t>::MAX))
            }
        }
    )*};
}
numeric_setting!(u16, u32, u64, usize);

impl SettingValue for bool {
    /// The words a command line's boolean flag accepts too, so flags, environment and `set` agree.
    fn parse_setting(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" | "t" | "true" | "on" | "1" => Ok(true),
            "n" | "no" | "f" | "false" | "off" | "0" => Ok(false),
            _ => Err("expected true or false (also yes/no, on/off, 1/0)".into()),
        }
    }
}

impl SettingValue for crate::direct::RouteSetting {
    fn parse_setting(s: &str) -> Result<Self, String> {
        s.parse()
    }
}

impl SettingValue for crate::node::contacts::ContactsSetting {
    fn parse_setting(s: &str) -> Result<Self, String> {
        s.parse()
    }
}

impl SettingValue for String {
    fn parse_setting(s: &str) -> Result<Self, String> {
        Ok(s.trim().to_string())
    }
}

impl SettingValue for Option<String> {
    /// Empty means unset.
    fn parse_setting(s: &str) -> Result<Self, String> {
        let s = s.trim();
        Ok((!s.is_empty()).then(|| s.to_string()))
    }
}

impl SettingValue for Vec<String> {
    /// A comma-separated list; empty items are skipped, so "" is the empty list.
    fn parse_setting(s: &str) -> Result<Self, String> {
        Ok(s.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect())
    }
}

/// Writing a setting's value as text, the form [`Config::set`] parses back.
trait SettingText {
    fn setting_text(&self) -> String;
}

macro_rules! display_setting_text {
    ($($t:ty),*) => {$(
        impl SettingText for $t {
            fn setting_text(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
display_setting_text!(
    u16,
    u32,
    u64,
    usize,
    bool,
    String,
    crate::direct::RouteSetting,
    crate::node::contacts::ContactsSetting
);

impl SettingText for Option<String> {
    fn setting_text(&self) -> String {
        self.clone().unwrap_or_default()
    }
}

impl SettingText for Vec<String> {
    fn setting_text(&self) -> String {
        self.join(",")
    }
}

/// The shape of a setting's value, for a front end (a command line, a form) that offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettingKind {
    /// `true`/`false` (also yes/no, on/off, 1/0). A command line may offer it as a bare flag.
    Bool,
    /// A comma-separated list; a command line may accept it repeated.
    List,
    /// Any other single value (a number, a word, a path); empty means unset where the
    /// setting may be unset.
    Value,
}

trait KindOf {
    const KIND: SettingKind;
}
macro_rules! kind_of {
    ($kind:ident: $($t:ty),*) => {$(
        impl KindOf for $t {
            const KIND: SettingKind = SettingKind::$kind;
        }
    )*};
}
kind_of!(Bool: bool);
kind_of!(List: Vec<String>);
kind_of!(Value: u16, u32, u64, usize, String, Option<String>, crate::direct::RouteSetting,
    crate::node::contacts::ContactsSetting);

/// One setting as a front end sees it: how to name it, where it is read from, what it means.
/// The command-line form of the settings (`tbon daemon --radix 8`) is built from these by the
/// CLI; the library itself parses no command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Setting {
    /// The canonical name, lower case with underscores (`port_range`): what [`Config::set`]
    /// takes. A command line spells it `--port-range`.
    pub name: &'static str,
    /// The environment variable [`Config::from_env`] reads: `TBON_` and the name upper-cased.
    pub env: &'static str,
    /// What it means, its unit and its bounds (the doc comment of the field of [`Config`]).
    pub doc: &'static str,
    /// The shape of its value.
    pub kind: SettingKind,
}

/// One table for every setting. Each entry: doc comment, `name: Type [= default]` and its
/// environment variable (must be `TBON_` + the upper-cased name: a test checks). Entries
/// without a default use `Default::default()` (empty/None).
macro_rules! settings {
    (@default $d:expr) => { $d };
    (@default) => { Default::default() };
    ($(
        $(#[doc = $doc:literal])*
        $name:ident : $ty:ty $(= $default:expr)? , env $env:literal ;
    )*) => {
        /// Every run-time setting of a daemon. Build it with [`Config::default`],
        /// [`Config::from_env`] or [`Config::set`] (by name, from text), or set the public
        /// fields; then call [`Config::validate`] before use (`from_env` does, and so does
        /// [`start`](crate::start)). [`Config::settings`] describes each for a front end.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Config {
            $(
                $(#[doc = $doc])*
                pub $name: $ty,
            )*
            /// The job key itself, for a program that holds it (e.g. from
            /// [`Key::generate`](crate::Key::generate), or its own secret store). Not a setting:
            /// never read from a flag, the environment or [`Config::set`], and never shown by
            /// `Debug`. When set, it is used instead of `key_file` and `TBON_KEY`.
            pub key: Option<crate::Key>,
        }

        impl Default for Config {
            /// The defaults, without reading the environment.
            fn default() -> Self {
                Config { $($name: settings!(@default $($default)?),)* key: None }
            }
        }

        /// Setting names, in table order.
        const NAMES: &[&str] = &[$(stringify!($name)),*];
        #[cfg(test)]
        const ENV_NAMES: &[&str] = &[$($env),*];
        /// Every setting described, in table order.
        const SETTINGS: &[Setting] = &[$(Setting {
            name: stringify!($name),
            env: $env,
            doc: concat!($($doc, "\n"),*),
            kind: <$ty as KindOf>::KIND,
        }),*];

        impl Config {
            /// Parse `value` into the setting whose canonical (lower-case) name is `name`.
            /// `None` if there is no such setting.
            fn set_canonical(&mut self, name: &str, value: &str) -> Option<Result<(), String>> {
                match name {
                    $(stringify!($name) => Some(
                        <$ty as SettingValue>::parse_setting(value).map(|v| self.$name = v)
                    ),)*
                    _ => None,
                }
            }

            /// The value of the setting whose canonical name is `name`, as text.
            fn get_canonical(&self, name: &str) -> Option<String> {
                match name {
                    $(stringify!($name) => Some(self.$name.setting_text()),)*
                    _ => None,
                }
            }
        }
    };
}

settings! {
    /// Radix (fan-out) of the routing tree. Values below 2 are used as 2, as in PRRTE.
    radix: u32 = 64, env "TBON_RADIX";
    /// Identity of the DVM: checked in the handshake (a daemon of another DVM is refused) and the
    /// first part of contact URIs. At most 255 bytes, no ';' and no whitespace.
    dvm_id: String = String::from("tbon"), env "TBON_DVM_ID";
    /// File holding the DVM's job key (at least 16 bytes; keep it private, mode 0600). Every
    /// connection proves both ways that it knows the key. `Config::key` comes before it;
    /// without either, `Config::from_env` takes the key itself from TBON_KEY. The key itself is
    /// never a flag (any user can read command lines). `tbon keygen FILE` makes one.
    key_file: Option<String>, env "TBON_KEY_FILE";
    /// Run without authentication when no key is given: anyone who can reach a daemon's port
    /// and knows the DVM identity can join and inject messages. Logged loudly.
    insecure: bool = false, env "TBON_INSECURE";
    /// Listen and connect over IPv4.
    ipv4: bool = true, env "TBON_IPV4";
    /// Listen and connect over IPv6.
    ipv6: bool = false, env "TBON_IPV6";
    /// TCP port to listen on; 0 picks an ephemeral port (the actual one goes into the contact
    /// URI). Exclusive with port_range.
    port: u16 = 0, env "TBON_PORT";
    /// Listen on the first free port in "LO-HI" (inclusive, 1..=65535), for sites whose
    /// firewalls only open a range. Unset: use `port`.
    port_range: Option<String>, env "TBON_PORT_RANGE";
    /// Comma list of interface names or CIDRs (10.0.0.0/8, fe80::/10) to use; empty = all.
    /// Exclusive with if_exclude. Loopback is used only if nothing else is left or if it is
    /// included explicitly (lo, 127.0.0.0/8).
    if_include: Vec<String>, env "TBON_IF_INCLUDE";
    /// Comma list of interface names or CIDRs not to use; empty = none. Exclusive with
    /// if_include.
    if_exclude: Vec<String>, env "TBON_IF_EXCLUDE";
    /// Comma list of CIDRs (10.78.0.0/16) of the networks that carry bulk traffic, where a
    /// node has several: a direct link (and the streams and messages on it) dials a peer's
    /// addresses in them first; a tree link (control: heartbeats, repairs, collectives,
    /// relayed messages) dials them last. Empty: no preference (same network first, then the
    /// peer's order). A failover may still take a link to a network of the other kind.
    bulk_networks: Vec<String>, env "TBON_BULK_NETWORKS";
    /// Largest message payload in bytes (PRRTE: 100 MB). Larger sends are refused; a larger
    /// incoming frame closes that connection. At most 4294967295 (32-bit length on the wire).
    msg_max_bytes: u64 = limits::MSG_MAX_BYTES_DEFAULT, env "TBON_MSG_MAX_BYTES";
    /// Rank 0 splits a broadcast payload larger than this many bytes into parts of about this
    /// size (at most 64 parts), and every daemon forwards each part to its children as it
    /// arrives: large broadcasts are pipelined down the tree instead of stored and forwarded
    /// whole at each level. Daemons still deliver whole payloads. 0: never split. Only rank
    /// 0's value matters.
    bcast_part_bytes: usize = limits::XCAST_PART_BYTES_DEFAULT, env "TBON_BCAST_PART_BYTES";
    /// Bytes queued per peer connection before sends are refused with back-pressure. At least
    /// msg_max_bytes.
    send_queue_max_bytes: usize = limits::SEND_QUEUE_MAX_BYTES_DEFAULT, env "TBON_SEND_QUEUE_MAX_BYTES";
    /// Link sessions: bytes a daemon keeps per neighbour, written and not yet acknowledged, to
    /// write again if the connection breaks while both live. At the bound it writes no more to
    /// that neighbour until acknowledgements come (back-pressure; nothing dropped). At least
    /// 1048576.
    link_resend_max_bytes: usize = limits::LINK_RESEND_MAX_BYTES_DEFAULT, env "TBON_LINK_RESEND_MAX_BYTES";
    /// Link sessions: keep what was written to a neighbour until it is acknowledged, to write
    /// it again after a break (true), or only count and acknowledge it (false: a broken
    /// connection between two living daemons loses what was in flight, as plain TCP does, and
    /// holding nothing costs less memory and time per frame). Daemons with either value work
    /// together; each decides for what it sends.
    link_resend: bool = true, env "TBON_LINK_RESEND";
    /// Streams: a daemon with a producer's stream data for a connected neighbour dials it a
    /// second, authenticated connection that carries only that data (one direction), so
    /// messages, heartbeats and acknowledgements never wait behind the kernel's buffers of
    /// stream bytes. false: stream data shares the link (its bulk line and bulk pipe). Daemons
    /// with either value work together.
    bulk_connection: bool = true, env "TBON_BULK_CONNECTION";
    /// Failover: a connection to a peer on which frames have waited for confirmation this
    /// many milliseconds with nothing heard back is taken as stalled (its network failed under
    /// it): it is closed and the peer dialled at its next address, and the link session writes
    /// again what was not confirmed. Capped at half of heartbeat_timeout_ms, so a failover
    /// has time to complete before the peer could be taken for dead. 0: off (a stalled
    /// connection then waits for TCP or the heartbeat timeout).
    link_stall_ms: u64 = limits::LINK_STALL_MS_DEFAULT, env "TBON_LINK_STALL_MS";
    /// Messages held for receives not posted yet; at the bound the oldest is dropped with a
    /// warning (PRRTE: unbounded).
    unmatched_max: usize = limits::UNMATCHED_MAX_DEFAULT, env "TBON_UNMATCHED_MAX";
    /// Commands that may wait for wire-up (sends to other daemons, broadcasts, allgathers;
    /// sends to this daemon need no wire-up and are not counted); further ones are refused
    /// `Busy` until the tree is up.
    prewire_queue_max: usize = limits::PREWIRE_QUEUE_MAX_DEFAULT, env "TBON_PREWIRE_QUEUE_MAX";
    /// Milliseconds a connection may spend in the handshake before it is closed.
    handshake_timeout_ms: u64 = limits::HANDSHAKE_TIMEOUT_MS_DEFAULT, env "TBON_HANDSHAKE_TIMEOUT_MS";
    /// Milliseconds for every daemon to report in at start-up; a daemon that never reports
    /// within this is marked failed.
    wireup_timeout_ms: u64 = limits::WIREUP_TIMEOUT_MS_DEFAULT, env "TBON_WIREUP_TIMEOUT_MS";
    /// Contacts a daemon keeps from wire-up: `subtree` (its ancestors' and its subtree's; any
    /// other is looked up from rank 0 when first needed) or `full` (every rank's: no lookups,
    /// but N squared bytes at wire-up in all). See docs/wireup.md.
    contacts: crate::node::contacts::ContactsSetting = crate::node::contacts::ContactsSetting::Subtree, env "TBON_CONTACTS";
    /// Start as a daemon restarted under the rank of a dead one: ask rank 0 to admit it back
    /// (a new incarnation, a new epoch, its old place in the tree) instead of taking part in
    /// wire-up. Refused, and the daemon stops saying why, if the rank is alive or rank 0 does
    /// not answer within twice wireup_timeout_ms. Not for rank 0 (a DVM ends with its rank 0).
    rejoin: bool = false, env "TBON_REJOIN";
    /// Daemons started with the DVM, ranks 0..initial_size; 0 means the whole size. The ranks
    /// from initial_size to size are room to grow: rank 0's wire-up does not wait for them,
    /// they are absent (failed, in epoch 0) until each joins as a restarted daemon rejoins
    /// (`rejoin`, `tbon daemon --join`). Every daemon gets the same size (the capacity).
    initial_size: u32 = 0, env "TBON_INITIAL_SIZE";
    /// First reconnect delay in milliseconds after a lost connection; doubles per attempt.
    reconnect_base_ms: u64 = 50, env "TBON_RECONNECT_BASE_MS";
    /// Cap on the reconnect delay in milliseconds.
    reconnect_max_ms: u64 = 2000, env "TBON_RECONNECT_MAX_MS";
    /// Reconnect attempts before the peer is treated as failed (PRRTE: 2 per address).
    reconnect_retries: u32 = limits::RECONNECT_RETRIES_DEFAULT, env "TBON_RECONNECT_RETRIES";
    /// TCP keepalive: idle seconds before the first probe. Tighter than PRRTE's 300 s so a
    /// half-open connection to a vanished host is found in about 2 minutes, not 8; it is only
    /// the backstop: heartbeats detect a silent tree neighbour in seconds.
    keepalive_idle_s: u32 = 60, env "TBON_KEEPALIVE_IDLE_S";
    /// TCP keepalive: seconds between probes (PRRTE: 20).
    keepalive_interval_s: u32 = 10, env "TBON_KEEPALIVE_INTERVAL_S";
    /// TCP keepalive: unanswered probes before the connection is dropped (PRRTE: 9).
    keepalive_count: u32 = 6, env "TBON_KEEPALIVE_COUNT";
    /// SO_SNDBUF and SO_RCVBUF of every connection in bytes; 0 keeps the kernel's default (and
    /// its autotuning, which is what you want outside tests). Otherwise at least 65536: below
    /// one MSS (64 KiB on loopback) the receiver withholds window updates and TCP crawls.
    socket_buffer_bytes: usize = 0, env "TBON_SOCKET_BUFFER_BYTES";
    /// Milliseconds between heartbeats to each tree neighbour (sent whatever other traffic
    /// there is; any bytes received count as a sign of life).
    heartbeat_interval_ms: u64 = 1000, env "TBON_HEARTBEAT_INTERVAL_MS";
    /// Milliseconds without any bytes from a tree neighbour before it is declared failed (a
    /// SIGSTOPped, hung or cut-off daemon). PRRTE relies on TCP keepalive (300 s); Flux waits
    /// 20-30 s. 10 s stays clear of false alarms on a loaded 2-core machine. Must exceed
    /// heartbeat_interval_ms.
    heartbeat_timeout_ms: u64 = 10_000, env "TBON_HEARTBEAT_TIMEOUT_MS";
    /// Reliable messaging: milliseconds an intermediate hop keeps a reliable message's data
    /// for replay (PRRTE: 500). A replay past it comes from further upstream, at worst from
    /// the origin, which keeps every message until it is acknowledged. 1..=3600000.
    relm_cache_ms: u64 = limits::RELM_CACHE_MS_DEFAULT, env "TBON_RELM_CACHE_MS";
    /// Reliable messaging: messages an intermediate hop caches (PRRTE: 30); at the bound the
    /// oldest copy is evicted. 1..=1048576.
    relm_cache_max: usize = limits::RELM_CACHE_MAX_DEFAULT, env "TBON_RELM_CACHE_MAX";
    /// Reliable messaging: milliseconds before an origin first retransmits an unacknowledged
    /// message; doubled per retransmission up to 8 times this. 1..=3600000.
    relm_retransmit_ms: u64 = limits::RELM_RETRANSMIT_MS_DEFAULT, env "TBON_RELM_RETRANSMIT_MS";
    /// Reliable messaging: milliseconds a daemon waits after a repair for its changed
    /// neighbours' link updates before sending its own to all of them anyway. 1..=3600000.
    relm_gate_ms: u64 = limits::RELM_GATE_MS_DEFAULT, env "TBON_RELM_GATE_MS";
    /// Reliable messaging: messages a daemon's callers may have sent and not yet had
    /// acknowledged; at the bound a reliable send returns Busy at the call. 1..=1048576.
    relm_unacked_max: usize = limits::RELM_UNACKED_MAX_DEFAULT, env "TBON_RELM_UNACKED_MAX";
    /// Reliable messaging: early messages a destination holds while their predecessor is
    /// missing; beyond it an early message is dropped unacknowledged and replayed later by its
    /// origin. 1..=1048576.
    relm_pending_max: usize = limits::RELM_PENDING_MAX_DEFAULT, env "TBON_RELM_PENDING_MAX";
    /// Direct links beside the tree (PVM's routing options): `tree` never asks for one and
    /// refuses requests; `direct` asks for a link to every daemon it sends to; `auto` asks
    /// once a destination takes more than direct_auto_messages or direct_auto_bytes within
    /// direct_auto_window_ms, and grants requests. A per-send `Route` overrides the asking.
    route: crate::direct::RouteSetting = crate::direct::RouteSetting::Tree, env "TBON_ROUTE";
    /// Direct links (asked for, granted or open) a daemon keeps at once; at the bound it asks
    /// for no more and denies requests. 1..=4096.
    direct_links_max: usize = limits::DIRECT_LINKS_MAX_DEFAULT, env "TBON_DIRECT_LINKS_MAX";
    /// route=auto: messages to one destination within the window before a link is asked for.
    direct_auto_messages: u64 = limits::DIRECT_AUTO_MESSAGES_DEFAULT, env "TBON_DIRECT_AUTO_MESSAGES";
    /// route=auto: payload bytes to one destination within the window before a link is asked
    /// for.
    direct_auto_bytes: u64 = limits::DIRECT_AUTO_BYTES_DEFAULT, env "TBON_DIRECT_AUTO_BYTES";
    /// route=auto: the window in milliseconds. 1..=3600000.
    direct_auto_window_ms: u64 = limits::DIRECT_AUTO_WINDOW_MS_DEFAULT, env "TBON_DIRECT_AUTO_WINDOW_MS";
    /// Milliseconds a denied request is remembered: no new request to that daemon meanwhile.
    /// 1..=3600000.
    direct_denial_ms: u64 = limits::DIRECT_DENIAL_MS_DEFAULT, env "TBON_DIRECT_DENIAL_MS";
    /// Milliseconds a request for a direct link (or a grant) waits for its answer; messages
    /// take the tree meanwhile. 1..=3600000.
    direct_request_ms: u64 = limits::DIRECT_REQUEST_MS_DEFAULT, env "TBON_DIRECT_REQUEST_MS";
    /// Path of the Unix-domain socket on which this daemon accepts client processes (issue
    /// "Jobs"; see `tbon::clients`); unset: no clients. A stale socket file there is
    /// replaced; a socket another process listens on, or any other file, is an error. The socket is made connectable by every user:
    /// admission is decided by client_uids and the job's client key.
    client_socket: Option<String>, env "TBON_CLIENT_SOCKET";
    /// Comma list of numeric uids whose processes may connect as clients (read from the
    /// socket with SO_PEERCRED); empty: only the daemon's own uid. A list replaces that
    /// default (include the daemon's own uid if its own processes connect too). A daemon
    /// running as root lists the jobs' users here.
    client_uids: Vec<String>, env "TBON_CLIENT_UIDS";
}

/// A setting's name as `set` and `get` take it (`RADIX`, `TBON_RADIX`, `port-range`) made
/// canonical (`radix`, `port_range`).
fn canonical(name: &str) -> String {
    let canon = name.trim().to_ascii_lowercase().replace('-', "_");
    match canon.strip_prefix("tbon_") {
        Some(rest) => rest.to_string(),
        None => canon,
    }
}

/// Linux's upper bounds for TCP_KEEPIDLE/TCP_KEEPINTVL and TCP_KEEPCNT; larger values make
/// setsockopt fail.
const KEEPALIVE_SECS_MAX: u32 = 32_767;
const KEEPALIVE_COUNT_MAX: u32 = 127;

impl Config {
    /// The uids `client_uids` lists (entries that do not parse are left out: `validate`
    /// refuses them); empty: the effective uid of this process.
    pub fn client_uid_list(&self) -> Vec<u32> {
        let list: Vec<u32> = self
            .client_uids
            .iter()
            .filter_map(|u| u.trim().parse().ok())
            .collect();
        if list.is_empty() {
            vec![nix::unistd::geteuid().as_raw()]
        } else {
            list
        }
    }

    /// The names of every setting, lower case, in table order (`radix`, `dvm_id`, ...). The
    /// environment variable of each is `TBON_` followed by the name in upper case.
    pub fn names() -> &'static [&'static str] {
        NAMES
    }

    /// Every setting described (name, environment variable, meaning, shape), in table order:
    /// what a front end needs to offer them, e.g. as command-line flags.
    pub fn settings() -> &'static [Setting] {
        SETTINGS
    }

    /// The value of one setting as text, in the form [`Config::set`] takes (lists joined by
    /// commas, an unset optional setting empty). `name` is spelled as for `set`; an unknown
    /// name is [`ConfigError::Unknown`].
    ///
    /// ```
    /// let cfg = tbon::config::Config::default();
    /// assert_eq!(cfg.get("radix").unwrap(), "64");
    /// assert_eq!(cfg.get("TBON_ROUTE").unwrap(), "tree");
    /// ```
    pub fn get(&self, name: &str) -> Result<String, ConfigError> {
        let canon = canonical(name);
        self.get_canonical(&canon)
            .ok_or_else(|| ConfigError::Unknown {
                name: name.to_string(),
            })
    }

    /// Defaults, then every `TBON_<NAME>` variable that is set and not empty, then (when no
    /// `key_file` was given) the job key itself from `TBON_KEY` into [`Config::key`], then
    /// [`Config::validate`]. Errors name the offending setting; a variable that is not UTF-8 is
    /// an error too. This is the only place the library reads settings from the environment:
    /// [`Config::default`] reads nothing (docs/config.md lists every variable tbon reads).
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(|var| std::env::var_os(var))
    }

    /// [`Config::from_env`] with the environment replaced by `lookup` (variable name to value).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        for &name in NAMES {
            let var = format!("TBON_{}", name.to_ascii_uppercase());
            let Some(raw) = lookup(&var) else { continue };
            let Some(value) = raw.to_str() else {
                return Err(ConfigError::BadValue {
                    setting: name,
                    value: raw.to_string_lossy().into_owned(),
                    reason: "not valid UTF-8".into(),
                });
            };
            // Set-but-empty counts as unset, as shells make it easy to export an empty variable.
            if !value.trim().is_empty() {
                cfg.set(name, value)?;
            }
        }
        if cfg.key_file.is_none() {
            cfg.key = crate::Key::from_variable(lookup(crate::driver::key::ENV_VAR))
                .map_err(ConfigError::Key)?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Set one setting by name from text. `name` may be `radix`, `RADIX`, `TBON_RADIX` or the
    /// flag spelling `port-range`. Lists are comma-separated; booleans accept true/false,
    /// yes/no, on/off, 1/0. Only the value's syntax is checked here: call
    /// [`Config::validate`] once all settings are made.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        let canon = canonical(name);
        let Some(&setting) = NAMES.iter().find(|n| **n == canon) else {
            return Err(ConfigError::Unknown {
                name: name.to_string(),
            });
        };
        match self.set_canonical(setting, value) {
            Some(Ok(())) => Ok(()),
            Some(Err(reason)) => Err(ConfigError::BadValue {
                setting,
                value: value.to_string(),
                reason,
            }),
            None => Err(ConfigError::Unknown {
                name: name.to_string(),
            }),
        }
    }

    /// The radix actually used: `radix`, with values below 2 clamped to 2 (as PRRTE does).
    pub fn effective_radix(&self) -> u32 {
        self.radix.max(2)
    }

    /// `port_range` as inclusive bounds, or `None` if unset.
    pub fn port_range_bounds(&self) -> Result<Option<(u16, u16)>, ConfigError> {
        let Some(range) = self.port_range.as_deref() else {
            return Ok(None);
        };
        let bad = |reason: &str| ConfigError::BadValue {
            setting: "port_range",
            value: range.to_string(),
            reason: reason.to_string(),
        };
        let (lo, hi) = range
            .split_once('-')
            .ok_or_else(|| bad("expected LO-HI, e.g. 20000-20100"))?;
        let lo: u16 = lo
            .trim()
            .parse()
            .map_err(|_| bad("LO is not a port number"))?;
        let hi: u16 = hi
            .trim()
            .parse()
            .map_err(|_| bad("HI is not a port number"))?;
        if lo == 0 {
            return Err(bad("ports start at 1"));
        }
        if lo > hi {
            return Err(bad("LO is above HI"));
        }
        Ok(Some((lo, hi)))
    }

    /// Check the settings alone and together. Returns the first problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(bad) = self
            .client_uids
            .iter()
            .find(|u| u.trim().parse::<u32>().is_err())
        {
            return Err(ConfigError::invalid(
                "client_uids",
                format!("{bad:?} is not a numeric uid"),
            ));
        }
        if self
            .client_socket
            .as_deref()
            .is_some_and(|p| p.is_empty() || p.len() > 100)
        {
            return Err(ConfigError::invalid(
                "client_socket",
                "a Unix socket path has 1 to 100 bytes",
            ));
        }
        if self.socket_buffer_bytes != 0
            && self.socket_buffer_bytes < limits::SOCKET_BUFFER_MIN_BYTES
        {
            return Err(ConfigError::invalid(
                "socket_buffer_bytes",
                "must be 0 (kernel default) or at least 65536: smaller buffers stall TCP",
            ));
        }
        let id = &self.dvm_id;
        if id.is_empty() || id.len() > 255 {
            return Err(ConfigError::invalid(
                "dvm_id",
                "must be 1 to 255 bytes long",
            ));
        }
        if id
            .chars()
            .any(|c| c == ';' || c.is_whitespace() || c.is_control())
        {
            return Err(ConfigError::invalid(
                "dvm_id",
                "must not contain ';', whitespace or control characters (it is part of contact URIs)",
            ));
        }
        if !self.ipv4 && !self.ipv6 {
            return Err(ConfigError::invalid(
                "ipv4",
                "ipv4 and ipv6 are both off: no address family left",
            ));
        }
        if self.port_range_bounds()?.is_some() && self.port != 0 {
            return Err(ConfigError::invalid(
                "port_range",
                "port and port_range are exclusive: set port to 0 to use a range",
            ));
        }
        let given = |l: &[String]| l.iter().any(|e| !e.trim().is_empty());
        if given(&self.if_include) && given(&self.if_exclude) {
            return Err(ConfigError::invalid(
                "if_include",
                "if_include and if_exclude are exclusive",
            ));
        }
        for (setting, list) in [
            ("if_include", &self.if_include),
            ("if_exclude", &self.if_exclude),
        ] {
            for entry in list.iter().filter(|e| !e.trim().is_empty()) {
                IfSpec::parse(entry).map_err(|e| ConfigError::BadValue {
                    setting,
                    value: entry.clone(),
                    reason: e.to_string(),
                })?;
            }
        }
        for entry in self.bulk_networks.iter().filter(|e| !e.trim().is_empty()) {
            entry
                .trim()
                .parse::<crate::oob::interfaces::Cidr>()
                .map_err(|e| ConfigError::BadValue {
                    setting: "bulk_networks",
                    value: entry.clone(),
                    reason: format!(
                        "{e} (a CIDR or an address: a peer's address is matched, not a local \
                         interface name)"
                    ),
                })?;
        }
        if self.msg_max_bytes == 0 || self.msg_max_bytes > limits::MSG_MAX_BYTES_CEILING {
            return Err(ConfigError::invalid(
                "msg_max_bytes",
                format!("must be 1..={}", limits::MSG_MAX_BYTES_CEILING),
            ));
        }
        if (self.send_queue_max_bytes as u64) < self.msg_max_bytes {
            return Err(ConfigError::invalid(
                "send_queue_max_bytes",
                "must be at least msg_max_bytes, or a maximal message could never be queued",
            ));
        }
        if self.unmatched_max == 0 {
            return Err(ConfigError::invalid("unmatched_max", "must be at least 1"));
        }
        for (setting, v) in [
            ("handshake_timeout_ms", self.handshake_timeout_ms),
            ("wireup_timeout_ms", self.wireup_timeout_ms),
            ("reconnect_base_ms", self.reconnect_base_ms),
            ("reconnect_max_ms", self.reconnect_max_ms),
            ("heartbeat_interval_ms", self.heartbeat_interval_ms),
            ("heartbeat_timeout_ms", self.heartbeat_timeout_ms),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(setting, "must be greater than 0"));
            }
        }
        if self.reconnect_base_ms > self.reconnect_max_ms {
            return Err(ConfigError::invalid(
                "reconnect_base_ms",
                "must not exceed reconnect_max_ms",
            ));
        }
        for (setting, v, max) in [
            (
                "keepalive_idle_s",
                self.keepalive_idle_s,
                KEEPALIVE_SECS_MAX,
            ),
            (
                "keepalive_interval_s",
                self.keepalive_interval_s,
                KEEPALIVE_SECS_MAX,
            ),
            ("keepalive_count", self.keepalive_count, KEEPALIVE_COUNT_MAX),
        ] {
            if v == 0 || v > max {
                return Err(ConfigError::invalid(setting, format!("must be 1..={max}")));
            }
        }
        if self.heartbeat_timeout_ms <= self.heartbeat_interval_ms {
            return Err(ConfigError::invalid(
                "heartbeat_timeout_ms",
                "must exceed heartbeat_interval_ms, or every neighbour times out between beats",
            ));
        }
        for (setting, v) in [
            ("relm_cache_ms", self.relm_cache_ms),
            ("relm_retransmit_ms", self.relm_retransmit_ms),
            ("relm_gate_ms", self.relm_gate_ms),
            ("direct_auto_window_ms", self.direct_auto_window_ms),
            ("direct_denial_ms", self.direct_denial_ms),
            ("direct_request_ms", self.direct_request_ms),
        ] {
            if v == 0 || v > limits::RELM_MS_CEILING {
                return Err(ConfigError::invalid(
                    setting,
                    format!("must be 1..={}", limits::RELM_MS_CEILING),
                ));
            }
        }
        for (setting, v) in [
            ("relm_cache_max", self.relm_cache_max),
            ("relm_unacked_max", self.relm_unacked_max),
            ("relm_pending_max", self.relm_pending_max),
        ] {
            if v == 0 || v > limits::RELM_COUNT_CEILING {
                return Err(ConfigError::invalid(
                    setting,
                    format!("must be 1..={}", limits::RELM_COUNT_CEILING),
                ));
            }
        }
        if self.link_resend_max_bytes < limits::LINK_RESEND_MIN_BYTES {
            return Err(ConfigError::invalid(
                "link_resend_max_bytes",
                format!(
                    "must be at least {} (a socket's worth: below it a sender waits for \
                     acknowledgements at every read of its peer)",
                    limits::LINK_RESEND_MIN_BYTES
                ),
            ));
        }
        if self.direct_links_max == 0 || self.direct_links_max > limits::DIRECT_LINKS_MAX_MAX {
            return Err(ConfigError::invalid(
                "direct_links_max",
                format!("must be 1..={}", limits::DIRECT_LINKS_MAX_MAX),
            ));
        }
        Ok(())
    }

    /// The reliable-messaging settings, for the protocol core. Not API.
    #[doc(hidden)]
    pub fn relm(&self) -> crate::relm::RelmConfig {
        crate::relm::RelmConfig {
            cache_ms: self.relm_cache_ms,
            cache_max: self.relm_cache_max,
            retransmit_ms: self.relm_retransmit_ms,
            gate_ms: self.relm_gate_ms,
            unacked_max: self.relm_unacked_max,
            pending_max: self.relm_pending_max,
        }
    }
}

#[cfg(test)]
mod tests;
