//! Opening a connection for an allowed request: vetting its addresses (the guard, address
//! deny entries), connecting through the dialer, and recording the allow, at once
//! ([`Decided::open`]) or once a tunnel's first bytes passed ([`Decided::dial`], then
//! [`Dialed::admit`] or [`Dialed::refuse`]).

use std::net::SocketAddr;

use sandgate_policy::Target;
use tokio_util::sync::CancellationToken;

use super::{Decided, Dialed, Egress, Grant, Opened, Refused, context};
use crate::dial::{HopTimes, VettedAddrs};
use crate::refusal::Refusal;

/// How long a hop may take to answer, and to stall.
fn hop_times(egress: &Egress) -> HopTimes {
    HopTimes {
        answer: egress.limits.response_timeout,
        stall: egress.limits.tunnel_idle_timeout,
    }
}

impl Decided {
    /// Vets the destination (a guard refusal or an address deny entry is this request's
    /// deny), records the allow, then connects through the dialer (directly, or through the
    /// upstream proxy when chained). The allow is on record before the connect starts; a
    /// failure to connect is recorded as its close.
    pub async fn open(self, egress: &Egress) -> Result<Opened, Refused> {
        let (decided, vetted) = self.vet(egress).await?;
        let (target, access) = (decided.target.clone(), decided.access);
        let mut grant = egress.allow(decided, vetted.primary(), None, None).await?;
        let times = hop_times(egress);
        let identity = grant.party.identity.clone();
        let dialed = egress
            .dialer
            .open(&vetted, &target, access, &identity, times)
            .await;
        match dialed {
            Ok((stream, addr)) => {
                // The close names the address actually connected to.
                grant.resolved = Some(addr.ip());
                Ok(Opened {
                    stream,
                    addr,
                    chained: egress.dialer.sends_absolute_form(),
                    grant,
                })
            }
            Err(error) => Err(egress.fail(grant, Refusal::Dial { target, error }, 0, 0).await),
        }
    }

    /// As [`Decided::open`] for a tunnel, whose first bytes decide it: vets and connects,
    /// and the allow is recorded only when the [`Dialed`] connection is admitted. A
    /// refusal, or a failure to connect (an allow followed by its close), is on record when
    /// this returns it.
    pub async fn dial(self, egress: &Egress) -> Result<Dialed, Refused> {
        let (decided, vetted) = self.vet(egress).await?;
        let (target, access) = (decided.target.clone(), decided.access);
        let identity = &decided.pending.party.identity;
        match egress
            .dialer
            .open(&vetted, &target, access, identity, hop_times(egress))
            .await
        {
            Ok((stream, addr)) => {
                // Cuttable from here on: a tunnel waiting for its first bytes is cut too.
                let stop = egress.stop_for(decided.rule.as_ref(), decided.expires);
                Ok(Dialed {
                    decided,
                    stream,
                    addr,
                    vetted_ip: vetted.primary(),
                    stop,
                })
            }
            Err(error) => {
                let grant = egress.allow(decided, vetted.primary(), None, None).await?;
                Err(egress.fail(grant, Refusal::Dial { target, error }, 0, 0).await)
            }
        }
    }

    /// Resolves and guards the destination, and applies the address deny entries. Each
    /// refusal is on record when this returns it; a failure to resolve is an allow
    /// followed by its close (allowed by policy, failed upstream).
    async fn vet(self, egress: &Egress) -> Result<(Decided, VettedAddrs), Refused> {
        let target = self.target.clone();
        let access = self.access;
        let vetted = match egress.dialer.vet(&target).await {
            Ok(v) => v,
            Err(error) if error.is_guard_refusal() => {
                let refusal = Refusal::Dial { target, error };
                return Err(egress
                    .refuse(self.pending, Some((&self.target, access)), refusal)
                    .await);
            }
            Err(error) => {
                let grant = egress.allow(self, None, None, None).await?;
                return Err(egress.fail(grant, Refusal::Dial { target, error }, 0, 0).await);
            }
        };
        // Deny entries that are addresses apply to what the name resolved to (not when
        // chained: no name is resolved here then, and the upstream applies its own policy).
        if !egress.dialer.is_chained() {
            let rules = egress.rules();
            let ctx = context(&self.pending.party.identity);
            let denied = vetted
                .ips()
                .find_map(|ip| Some((ip, rules.deny_address(ip, target.port, &ctx)?.label.clone())));
            if let Some((ip, rule)) = denied {
                let refusal = Refusal::AddressDenied {
                    target: target.clone(),
                    ip,
                    rule,
                };
                return Err(egress
                    .refuse(self.pending, Some((&target, access)), refusal)
                    .await);
            }
        }
        Ok((self, vetted))
    }

    /// Records the allow for a request served on a kept upstream connection to `addr`,
    /// which was vetted for this same destination; refused (on record) if the audit log
    /// has failed since the decision.
    pub async fn reuse(self, egress: &Egress, addr: SocketAddr) -> Result<Grant, Refused> {
        egress.allow(self, Some(addr.ip()), None, None).await
    }

    /// Whether an entry with methods or paths allowed it: what they cannot judge (a body on
    /// a read) must then be refused by the front end.
    pub fn judged(&self) -> bool {
        self.judged
    }

    /// Refuses what the policy allowed, for what only the front end could see (a
    /// credential's placeholder where it does not belong): the request's one decision is
    /// this deny.
    pub async fn refuse(self, egress: &Egress, refusal: Refusal) -> Refused {
        let Decided {
            pending,
            target,
            access,
            ..
        } = self;
        egress.refuse(pending, Some((&target, access)), refusal).await
    }
}

impl Dialed {
    /// Records the allow (with the TLS server name read, if any): the connection is the
    /// request's. Refused (on record; the connection dropped unused) if the audit log has
    /// failed since the decision: a tunnel waits for its first bytes in between.
    pub async fn admit(self, egress: &Egress, tls_server_name: Option<String>) -> Result<Opened, Refused> {
        let Dialed {
            decided,
            stream,
            addr,
            vetted_ip,
            stop,
        } = self;
        let mut grant = egress
            .allow(decided, vetted_ip, tls_server_name, Some(stop))
            .await?;
        // The close names the address actually connected to.
        grant.resolved = Some(addr.ip());
        Ok(Opened {
            stream,
            addr,
            chained: egress.dialer.sends_absolute_form(),
            grant,
        })
    }

    /// Records `refusal` as the request's deny; the connection is dropped unused.
    pub async fn refuse(self, egress: &Egress, refusal: Refusal) -> Refused {
        let Decided {
            pending,
            target,
            access,
            ..
        } = self.decided;
        egress.refuse(pending, Some((&target, access)), refusal).await
    }

    /// The destination.
    pub fn target(&self) -> &Target {
        &self.decided.target
    }

    /// Opened to be intercepted: each request inside is decided on its own
    /// (`http1/intercept/`).
    pub fn inspects(&self) -> bool {
        self.decided.inspect
    }

    /// Cancelled when the tunnel must end before it starts (shutdown, revocation, expiry).
    pub fn stop(&self) -> &CancellationToken {
        &self.stop.0
    }
}
