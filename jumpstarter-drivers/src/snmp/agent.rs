//! An SNMPv3 manager for one request at a time: engine discovery, then a SET of one
//! INTEGER, with the user's security level, retransmitting until the deadline.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use tokio::net::UdpSocket;

use super::{
    ber::{self, Reader},
    error::SnmpError,
    usm::{self, AUTH_PARAMS_LEN, AuthProto, PrivProto},
};

/// The largest message we accept (and say we accept).
const MAX_SIZE: usize = 65507;
/// How long to wait for an answer before sending the request again.
const RETRANSMIT: Duration = Duration::from_secs(1);
/// `usmStats...` counters an agent reports instead of answering.
const USM_STATS: [u32; 9] = [1, 3, 6, 1, 6, 3, 15, 1, 1];
/// `snmpUnknownPDUHandlers`'s tree and friends (RFC 3412 `snmpMPDStats`).
const MPD_STATS: [u32; 9] = [1, 3, 6, 1, 6, 3, 11, 2, 1];
/// `usmStatsNotInTimeWindows.0`: the report that carries the agent's clock.
const NOT_IN_TIME_WINDOW: [u32; 11] = [1, 3, 6, 1, 6, 3, 15, 1, 1, 2, 0];
/// `msgFlags` authFlag.
const AUTH_FLAG: u8 = 0x01;
/// `msgFlags` privFlag.
const PRIV_FLAG: u8 = 0x02;
/// `msgFlags` reportableFlag.
const REPORTABLE_FLAG: u8 = 0x04;

/// A user's security level and keys (the master keys, before localization).
#[derive(Debug, Clone)]
pub enum Security {
    /// noAuthNoPriv.
    None,
    /// authNoPriv.
    Auth {
        /// HMAC protocol.
        proto: AuthProto,
        /// Master key from `auth_key`.
        key: Vec<u8>,
    },
    /// authPriv.
    Priv {
        /// HMAC protocol.
        proto: AuthProto,
        /// Master key from `auth_key`.
        key: Vec<u8>,
        /// Cipher.
        priv_proto: PrivProto,
        /// Master key from `priv_key` (hashed with the auth protocol).
        priv_key: Vec<u8>,
    },
}

/// What the agent's engine told us about itself.
#[derive(Debug, Clone)]
struct Engine {
    id: Vec<u8>,
    boots: u32,
    time: u32,
    at: Instant,
}

impl Engine {
    fn time_now(&self) -> u32 {
        let elapsed = u32::try_from(self.at.elapsed().as_secs()).unwrap_or(u32::MAX);
        self.time.saturating_add(elapsed)
    }
}

/// A decoded incoming message.
#[derive(Debug)]
struct Incoming {
    msg_id: i64,
    engine: Engine,
    pdu_tag: u8,
    request_id: i64,
    error_status: i64,
    error_index: i64,
    oids: Vec<Vec<u32>>,
}

/// One user on one agent.
#[derive(Debug)]
pub struct Agent {
    /// Where the agent listens.
    pub addr: SocketAddr,
    /// The USM user name.
    pub user: String,
    /// The user's security.
    pub security: Security,
}

fn random_u64() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

fn random_id() -> i64 {
    i64::from((random_u64() & 0x7fff_ffff) as u32)
}

impl Agent {
    /// Sets `oid` to the INTEGER `value`, within `timeout` for the whole exchange.
    pub async fn set_integer(
        &self,
        oid: &[u32],
        value: i64,
        timeout: Duration,
    ) -> Result<(), SnmpError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut varbind = Vec::new();
        {
            let mut vb = Vec::new();
            ber::oid(&mut vb, oid)?;
            ber::integer(&mut vb, value);
            ber::tlv(&mut varbind, ber::SEQUENCE, &vb);
        }
        let bind: SocketAddr = if self.addr.is_ipv6() {
            "[::]:0"
                .parse()
                .map_err(|_| SnmpError::Malformed("bind address".into()))?
        } else {
            "0.0.0.0:0"
                .parse()
                .map_err(|_| SnmpError::Malformed("bind address".into()))?
        };
        let socket = UdpSocket::bind(bind)
            .await
            .map_err(|source| SnmpError::Io {
                what: "bind a UDP socket",
                source,
            })?;
        socket
            .connect(self.addr)
            .await
            .map_err(|source| SnmpError::Io {
                what: "connect the UDP socket to the agent",
                source,
            })?;
        let x = Exchange {
            agent: self,
            socket: &socket,
            deadline,
            timeout,
        };
        // Engine discovery (RFC 3414 4): an empty, unauthenticated request; the agent reports
        // its engine ID, boots and time.
        let mut engine = x.discover().await?;
        // A second try after a notInTimeWindow report, which carries the engine's clock.
        for _ in 0..2 {
            let request_id = random_id();
            let pdu = pdu(ber::SET_REQUEST, request_id, &varbind);
            let reply = x.request(&engine, &pdu, request_id).await?;
            match reply.pdu_tag {
                ber::RESPONSE => {
                    if reply.error_status != 0 {
                        let at = usize::try_from(reply.error_index)
                            .ok()
                            .and_then(|i| i.checked_sub(1))
                            .and_then(|i| reply.oids.get(i))
                            .map_or_else(|| dotted(oid), |o| dotted(o));
                        return Err(SnmpError::Status {
                            status: error_status_name(reply.error_status),
                            oid: at,
                        });
                    }
                    return Ok(());
                }
                ber::REPORT => {
                    let report = reply.oids.first().cloned().unwrap_or_default();
                    // Authenticated (`decode` drops one that is not): the agent's clock.
                    if report == NOT_IN_TIME_WINDOW {
                        engine = reply.engine;
                        continue;
                    }
                    return Err(report_error(&report));
                }
                other => {
                    return Err(SnmpError::Malformed(format!(
                        "unexpected PDU type {other:#04x} in the answer"
                    )));
                }
            }
        }
        Err(SnmpError::Report {
            what: "the agent's clock kept rejecting our messages (notInTimeWindow)".into(),
            field: "host",
        })
    }
}

/// A GetRequest/SetRequest PDU with the given encoded varbinds.
fn pdu(tag: u8, request_id: i64, varbinds: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    ber::integer(&mut body, request_id);
    ber::integer(&mut body, 0);
    ber::integer(&mut body, 0);
    ber::tlv(&mut body, ber::SEQUENCE, varbinds);
    let mut out = Vec::new();
    ber::tlv(&mut out, tag, &body);
    out
}

struct Exchange<'a> {
    agent: &'a Agent,
    socket: &'a UdpSocket,
    deadline: tokio::time::Instant,
    timeout: Duration,
}

impl Exchange<'_> {
    async fn discover(&self) -> Result<Engine, SnmpError> {
        let request_id = random_id();
        let probe = Engine {
            id: Vec::new(),
            boots: 0,
            time: 0,
            at: Instant::now(),
        };
        let pdu = pdu(ber::GET_REQUEST, request_id, &[]);
        let reply = self
            .send_and_wait(&probe, &pdu, request_id, Level::NoAuth)
            .await?;
        if reply.engine.id.is_empty() {
            return Err(SnmpError::Malformed(
                "the agent's discovery report names no engine ID".into(),
            ));
        }
        Ok(reply.engine)
    }

    async fn request(
        &self,
        engine: &Engine,
        pdu: &[u8],
        request_id: i64,
    ) -> Result<Incoming, SnmpError> {
        match self
            .send_and_wait(engine, pdu, request_id, Level::User)
            .await
        {
            Err(SnmpError::NoAnswer { addr, timeout }) => {
                Err(SnmpError::RequestDropped { addr, timeout })
            }
            other => other,
        }
    }

    async fn send_and_wait(
        &self,
        engine: &Engine,
        pdu: &[u8],
        request_id: i64,
        level: Level,
    ) -> Result<Incoming, SnmpError> {
        let msg_id = random_id();
        let security = match level {
            Level::NoAuth => &Security::None,
            Level::User => &self.agent.security,
        };
        let user = match level {
            Level::NoAuth => "",
            Level::User => self.agent.user.as_str(),
        };
        let keys = Keys::localized(security, &engine.id);
        let message = encode(msg_id, engine, user, &keys, pdu)?;
        let mut buf = vec![0u8; MAX_SIZE];
        loop {
            if tokio::time::Instant::now() >= self.deadline {
                return Err(self.no_answer());
            }
            self.socket
                .send(&message)
                .await
                .map_err(|source| SnmpError::Io {
                    what: "send to the agent",
                    source,
                })?;
            let wait_until = (tokio::time::Instant::now() + RETRANSMIT).min(self.deadline);
            loop {
                let n = match tokio::time::timeout_at(wait_until, self.socket.recv(&mut buf)).await
                {
                    Err(_) => break,
                    // ICMP port unreachable: nothing listens there (yet); keep trying until the
                    // deadline, as a PDU that reboots would want.
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        tokio::time::sleep_until(wait_until).await;
                        break;
                    }
                    Ok(Err(source)) => {
                        return Err(SnmpError::Io {
                            what: "receive from the agent",
                            source,
                        });
                    }
                    Ok(Ok(n)) => n,
                };
                // Anything that is not the answer to this message is dropped.
                match decode(&buf[..n], &keys) {
                    Ok(Some(reply))
                        if reply.msg_id == msg_id
                            && (reply.request_id == request_id || reply.pdu_tag == ber::REPORT) =>
                    {
                        return Ok(reply);
                    }
                    Ok(_) => {}
                    Err(e @ SnmpError::WrongDigest) => return Err(e),
                    Err(e) => tracing::debug!(
                        "dropped an SNMP datagram: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    ),
                }
            }
        }
    }

    fn no_answer(&self) -> SnmpError {
        SnmpError::NoAnswer {
            addr: self.agent.addr,
            timeout: self.timeout,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Level {
    NoAuth,
    User,
}

/// Localized keys for one engine.
struct Keys {
    auth: Option<(AuthProto, Vec<u8>)>,
    privacy: Option<(PrivProto, Vec<u8>)>,
}

impl Keys {
    fn localized(security: &Security, engine_id: &[u8]) -> Keys {
        match security {
            Security::None => Keys {
                auth: None,
                privacy: None,
            },
            Security::Auth { proto, key } => Keys {
                auth: Some((*proto, usm::localize(*proto, key, engine_id))),
                privacy: None,
            },
            Security::Priv {
                proto,
                key,
                priv_proto,
                priv_key,
            } => Keys {
                auth: Some((*proto, usm::localize(*proto, key, engine_id))),
                privacy: Some((*priv_proto, usm::localize(*proto, priv_key, engine_id))),
            },
        }
    }

    /// The authFlag and privFlag of messages with these keys (their security level).
    fn level(&self) -> u8 {
        let auth = if self.auth.is_some() { AUTH_FLAG } else { 0 };
        let privacy = if self.privacy.is_some() { PRIV_FLAG } else { 0 };
        auth | privacy
    }

    fn flags(&self) -> u8 {
        REPORTABLE_FLAG | self.level()
    }
}

fn encode(
    msg_id: i64,
    engine: &Engine,
    user: &str,
    keys: &Keys,
    pdu: &[u8],
) -> Result<Vec<u8>, SnmpError> {
    let time = engine.time_now();
    let mut scoped_body = Vec::new();
    ber::octets(&mut scoped_body, &engine.id);
    ber::octets(&mut scoped_body, b"");
    scoped_body.extend_from_slice(pdu);
    let mut scoped = Vec::new();
    ber::tlv(&mut scoped, ber::SEQUENCE, &scoped_body);

    let (msg_data, priv_params) = match &keys.privacy {
        None => (scoped, Vec::new()),
        Some((proto, key)) => {
            let salt = match proto {
                // RFC 3414 8.1.1.1: engine boots, then a local counter.
                PrivProto::Des => {
                    let mut s = [0u8; 8];
                    s[..4].copy_from_slice(&engine.boots.to_be_bytes());
                    s[4..].copy_from_slice(&(random_u64() as u32).to_be_bytes());
                    s
                }
                PrivProto::Aes => random_u64().to_be_bytes(),
            };
            let encrypted = usm::encrypt(*proto, key, engine.boots, time, salt, &scoped)?;
            let mut data = Vec::new();
            ber::octets(&mut data, &encrypted);
            (data, salt.to_vec())
        }
    };

    let mut global = Vec::new();
    ber::integer(&mut global, msg_id);
    ber::integer(&mut global, MAX_SIZE as i64);
    ber::octets(&mut global, &[keys.flags()]);
    ber::integer(&mut global, 3);

    let mut usm_body = Vec::new();
    ber::octets(&mut usm_body, &engine.id);
    ber::integer(&mut usm_body, i64::from(engine.boots));
    ber::integer(&mut usm_body, i64::from(time));
    ber::octets(&mut usm_body, user.as_bytes());
    let auth_placeholder = if keys.auth.is_some() {
        &[0u8; AUTH_PARAMS_LEN][..]
    } else {
        &[][..]
    };
    ber::octets(&mut usm_body, auth_placeholder);
    ber::octets(&mut usm_body, &priv_params);
    let mut usm_seq = Vec::new();
    ber::tlv(&mut usm_seq, ber::SEQUENCE, &usm_body);

    let mut body = Vec::new();
    ber::integer(&mut body, 3);
    ber::tlv(&mut body, ber::SEQUENCE, &global);
    ber::octets(&mut body, &usm_seq);
    body.extend_from_slice(&msg_data);
    let mut message = Vec::new();
    ber::tlv(&mut message, ber::SEQUENCE, &body);

    if let Some((proto, key)) = &keys.auth {
        let offset = parse_header(&message)?.auth_offset;
        let mac = usm::hmac96(*proto, key, &message);
        message[offset..offset + AUTH_PARAMS_LEN].copy_from_slice(&mac);
    }
    Ok(message)
}

/// The parts of a message before its data.
struct Header<'a> {
    msg_id: i64,
    flags: u8,
    engine: Engine,
    auth_params: &'a [u8],
    auth_offset: usize,
    priv_params: &'a [u8],
    data: ber::Tlv<'a>,
}

fn parse_header(buf: &[u8]) -> Result<Header<'_>, SnmpError> {
    let mut r = Reader::new(buf)
        .expect(ber::SEQUENCE, "an SNMP message")?
        .reader();
    let version = r.read()?.integer()?;
    if version != 3 {
        return Err(SnmpError::Malformed(format!(
            "SNMP version {} message (expected 3)",
            version + 1
        )));
    }
    let mut g = r.expect(ber::SEQUENCE, "msgGlobalData")?.reader();
    let msg_id = g.read()?.integer()?;
    let _max_size = g.read()?.integer()?;
    let flags = g.read()?.octets()?.first().copied().unwrap_or(0);
    let model = g.read()?.integer()?;
    if model != 3 {
        return Err(SnmpError::Malformed(format!(
            "security model {model} (expected USM)"
        )));
    }
    let sec = r.expect(ber::OCTET_STRING, "msgSecurityParameters")?;
    let mut u = sec
        .reader()
        .expect(ber::SEQUENCE, "UsmSecurityParameters")?
        .reader();
    let id = u.read()?.octets()?.to_vec();
    let boots = u.read()?.integer()?;
    let time = u.read()?.integer()?;
    let _user = u.read()?.octets()?;
    let auth = u.expect(ber::OCTET_STRING, "msgAuthenticationParameters")?;
    let priv_params = u.read()?.octets()?;
    let data = r.read()?;
    Ok(Header {
        msg_id,
        flags,
        engine: Engine {
            id,
            boots: u32::try_from(boots).unwrap_or(0),
            time: u32::try_from(time).unwrap_or(0),
            at: Instant::now(),
        },
        auth_params: auth.content,
        auth_offset: auth.offset,
        priv_params,
        data,
    })
}

/// Decodes an answer to a message sent with `keys`; `Ok(None)` for a message that is not
/// for us to read, or that is not the agent's for its security level.
fn decode(buf: &[u8], keys: &Keys) -> Result<Option<Incoming>, SnmpError> {
    let h = parse_header(buf)?;
    let level = h.flags & (AUTH_FLAG | PRIV_FLAG);
    if level == PRIV_FLAG {
        // RFC 3412 7.2.5.
        return Err(SnmpError::Malformed(
            "msgFlags ask for privacy without authentication".into(),
        ));
    }
    if h.flags & AUTH_FLAG != 0 {
        let Some((proto, key)) = &keys.auth else {
            return Ok(None);
        };
        if h.auth_params.len() != AUTH_PARAMS_LEN {
            return Err(SnmpError::Malformed(
                "authentication parameters of a bad length".into(),
            ));
        }
        let mut zeroed = buf.to_vec();
        zeroed[h.auth_offset..h.auth_offset + AUTH_PARAMS_LEN].fill(0);
        if usm::hmac96(*proto, key, &zeroed)[..] != *h.auth_params {
            return Err(SnmpError::WrongDigest);
        }
    }
    let plain;
    let scoped = if h.flags & PRIV_FLAG != 0 {
        let Some((proto, key)) = &keys.privacy else {
            return Ok(None);
        };
        let salt: [u8; 8] = h
            .priv_params
            .try_into()
            .map_err(|_| SnmpError::Malformed("privacy parameters of a bad length".into()))?;
        plain = usm::decrypt(
            *proto,
            key,
            h.engine.boots,
            h.engine.time,
            salt,
            h.data.octets()?,
        )?;
        Reader::new(&plain).expect(ber::SEQUENCE, "a ScopedPDU")?
    } else {
        if h.data.tag != ber::SEQUENCE {
            return Ok(None);
        }
        h.data
    };
    let mut s = scoped.reader();
    let _context_engine = s.read()?.octets()?;
    let _context_name = s.read()?.octets()?;
    let p = s.read()?;
    // RFC 3412 7.2.10: a Response comes at the security level of its request. One below it
    // is not the agent's: whoever sees the request (its msgID is in clear) could forge it.
    // Only a Report may come below (RFC 3414 3.2: the agent sends the errors it could not
    // authenticate or decrypt, unknownEngineID among them, in noAuthNoPriv). (An answer
    // above the request's level was dropped above: we have no key for it.)
    if p.tag != ber::REPORT && level != keys.level() {
        return Ok(None);
    }
    let mut pr = p.reader();
    let request_id = pr.read()?.integer()?;
    let error_status = pr.read()?.integer()?;
    let error_index = pr.read()?.integer()?;
    let mut vbs = pr.expect(ber::SEQUENCE, "VarBindList")?.reader();
    let mut oids = Vec::new();
    while !vbs.is_empty() && oids.len() < 64 {
        let mut vb = vbs.expect(ber::SEQUENCE, "VarBind")?.reader();
        oids.push(vb.read()?.oid()?);
    }
    // notInTimeWindow sets our notion of the agent's clock, for the message sent again: so
    // it is only read authenticated, as the agent sends it (RFC 3414 3.2 step 7b).
    if p.tag == ber::REPORT
        && level & AUTH_FLAG == 0
        && oids.first().is_some_and(|o| *o == NOT_IN_TIME_WINDOW)
    {
        return Ok(None);
    }
    Ok(Some(Incoming {
        msg_id: h.msg_id,
        engine: h.engine,
        pdu_tag: p.tag,
        request_id,
        error_status,
        error_index,
        oids,
    }))
}

/// Dotted notation of an OID.
pub fn dotted(oid: &[u32]) -> String {
    oid.iter().map(u32::to_string).collect::<Vec<_>>().join(".")
}

fn error_status_name(status: i64) -> String {
    const NAMES: [&str; 19] = [
        "noError",
        "tooBig",
        "noSuchName",
        "badValue",
        "readOnly",
        "genErr",
        "noAccess",
        "wrongType",
        "wrongLength",
        "wrongEncoding",
        "wrongValue",
        "noCreation",
        "inconsistentValue",
        "resourceUnavailable",
        "commitFailed",
        "undoFailed",
        "authorizationError",
        "notWritable",
        "inconsistentName",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("error status {status}"), |n| (*n).to_string())
}

/// What a Report PDU's first varbind means, naming the config field at fault.
fn report_error(oid: &[u32]) -> SnmpError {
    let (what, field) = if let Some(rest) = oid.strip_prefix(&USM_STATS[..]) {
        match rest.first() {
            Some(1) => (
                "the user's security level is not supported by the agent (usmStatsUnsupportedSecLevels)",
                "auth_protocol",
            ),
            Some(3) => ("unknown user name (usmStatsUnknownUserNames)", "user"),
            Some(4) => ("unknown engine ID (usmStatsUnknownEngineIDs)", "host"),
            Some(5) => (
                "wrong authentication key or protocol (usmStatsWrongDigests)",
                "auth_key",
            ),
            Some(6) => (
                "the agent could not decrypt the request (usmStatsDecryptionErrors)",
                "priv_key",
            ),
            _ => ("USM error", "user"),
        }
    } else if oid.starts_with(&MPD_STATS[..]) {
        ("message processing error (snmpMPDStats)", "host")
    } else {
        ("report", "oid")
    };
    SnmpError::Report {
        what: format!("{what}: {}", dotted(oid)),
        field,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        Engine {
            id: vec![0x80, 0, 0x1f, 0x88, 4, 1, 2, 3],
            boots: 7,
            time: 1234,
            at: Instant::now(),
        }
    }

    #[test]
    fn encoded_messages_decode_with_the_same_keys() {
        let eng = engine();
        let securities = [
            Security::None,
            Security::Auth {
                proto: AuthProto::Sha,
                key: usm::password_to_key(AuthProto::Sha, b"authpass"),
            },
            Security::Priv {
                proto: AuthProto::Md5,
                key: usm::password_to_key(AuthProto::Md5, b"authpass"),
                priv_proto: PrivProto::Des,
                priv_key: usm::password_to_key(AuthProto::Md5, b"privpass"),
            },
            Security::Priv {
                proto: AuthProto::Sha,
                key: usm::password_to_key(AuthProto::Sha, b"authpass"),
                priv_proto: PrivProto::Aes,
                priv_key: usm::password_to_key(AuthProto::Sha, b"privpass"),
            },
        ];
        for sec in &securities {
            let keys = Keys::localized(sec, &eng.id);
            let mut vb = Vec::new();
            let mut one = Vec::new();
            ber::oid(&mut one, &[1, 3, 6, 1, 4, 1, 9, 1]).unwrap();
            ber::integer(&mut one, 1);
            ber::tlv(&mut vb, ber::SEQUENCE, &one);
            let msg = encode(42, &eng, "user", &keys, &pdu(ber::SET_REQUEST, 9, &vb)).unwrap();
            let got = decode(&msg, &keys).unwrap().unwrap();
            assert_eq!(got.msg_id, 42);
            assert_eq!(got.request_id, 9);
            assert_eq!(got.pdu_tag, ber::SET_REQUEST);
            assert_eq!(got.oids, vec![vec![1, 3, 6, 1, 4, 1, 9, 1]]);
            assert_eq!(got.engine.boots, 7);
            if keys.auth.is_some() {
                // One flipped bit anywhere fails the digest (or the decoding).
                let mut bad = msg.clone();
                let last = bad.len() - 1;
                bad[last] ^= 1;
                assert!(decode(&bad, &keys).is_err());
            }
        }
    }

    #[test]
    fn answers_below_the_requests_security_level_are_dropped_but_error_reports() {
        let eng = engine();
        let sha = AuthProto::Sha;
        let auth_priv = Keys::localized(
            &Security::Priv {
                proto: sha,
                key: usm::password_to_key(sha, b"authpass"),
                priv_proto: PrivProto::Aes,
                priv_key: usm::password_to_key(sha, b"privpass"),
            },
            &eng.id,
        );
        let auth_only = Keys {
            auth: auth_priv.auth.clone(),
            privacy: None,
        };
        let none = Keys::localized(&Security::None, &eng.id);
        let answer = |tag: u8, oid: &[u32], keys: &Keys| {
            let mut one = Vec::new();
            ber::oid(&mut one, oid).unwrap();
            ber::integer(&mut one, 1);
            let mut vb = Vec::new();
            ber::tlv(&mut vb, ber::SEQUENCE, &one);
            encode(42, &eng, "user", keys, &pdu(tag, 9, &vb)).unwrap()
        };
        let unknown_engine = [&USM_STATS[..], &[4, 0]].concat();
        let read = |msg: &[u8], keys: &Keys| decode(msg, keys).unwrap().is_some();
        // A Response: only at the request's level.
        let response = |keys: &Keys| answer(ber::RESPONSE, &[1, 3, 6, 1, 4, 1, 9, 1], keys);
        assert!(read(&response(&auth_priv), &auth_priv));
        assert!(!read(&response(&none), &auth_priv));
        assert!(!read(&response(&auth_only), &auth_priv));
        assert!(!read(&response(&none), &auth_only));
        assert!(read(&response(&none), &none));
        // Error reports come in noAuthNoPriv.
        assert!(read(
            &answer(ber::REPORT, &unknown_engine, &none),
            &auth_priv
        ));
        // notInTimeWindow moves the clock: authenticated only (authNoPriv, as agents send it).
        let late = |keys: &Keys| answer(ber::REPORT, &NOT_IN_TIME_WINDOW, keys);
        assert!(read(&late(&auth_only), &auth_priv));
        assert!(read(&late(&auth_only), &auth_only));
        assert!(!read(&late(&none), &auth_priv));
        assert!(!read(&late(&none), &auth_only));
        assert!(!read(&late(&none), &none));
        // Other PDUs below the level are not read for what they say either.
        assert!(!read(&answer(0xa4, &[1, 3, 6], &none), &auth_only));
        // Privacy without authentication is no security level (RFC 3412 7.2.5).
        let mut priv_only = response(&none);
        let flags_at = priv_only
            .windows(3)
            .position(|w| w == [ber::OCTET_STRING, 1, REPORTABLE_FLAG])
            .unwrap()
            + 2;
        priv_only[flags_at] = REPORTABLE_FLAG | PRIV_FLAG;
        let err = decode(&priv_only, &auth_priv).unwrap_err().to_string();
        assert!(err.contains("privacy without authentication"), "{err}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let keys = Keys::localized(&Security::None, b"x");
        for bad in [
            &b""[..],
            b"\x30\x03\x02\x01\x01",
            b"\x30\x80",
            &[0xffu8; 40],
        ] {
            assert!(decode(bad, &keys).is_err());
        }
    }

    #[test]
    fn reports_name_the_field_at_fault() {
        let e = report_error(&[1, 3, 6, 1, 6, 3, 15, 1, 1, 3, 0]);
        assert!(e.to_string().contains("`user`"), "{e}");
        let e = report_error(&[1, 3, 6, 1, 6, 3, 15, 1, 1, 5, 0]);
        assert!(e.to_string().contains("`auth_key`"), "{e}");
    }
}
