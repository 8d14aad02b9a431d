//! What a release may reach: the files its tools may read and the network
//! targets its tools and models may connect to. A release is a tenant's
//! code, so everything it declares is hostile input; the site decides, in
//! one rule each:
//!
//! - Files: a grant is refused when it is at, above or below a protected
//!   root (the data dir, the configuration, the TLS files, the backups,
//!   the artifact store, the work root), wherever it came from
//!   ([`protected_conflict`]). Paths a release declares (`readPaths`) must
//!   also lie inside what the site allows (`runtime.tool_read_allow`).
//! - Network: a target a release names (a site endpoint, an `mcp-http`
//!   URL, a model endpoint) must match the site's allowlist
//!   (`runtime.network_allow`, and per tenant
//!   `runtime.network_allow_by_tenant`); loopback, link-local, cloud
//!   metadata and the appliance's own listeners only by an exact entry
//!   that writes the literal address and port, whatever a name resolves
//!   to ([`target_refusal`]).
//!
//! Pure: paths arrive absolute and resolved, addresses resolved.

use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The most site endpoints one tool may name.
pub const MAX_SITE_ENDPOINTS: usize = 16;

/// A site endpoint offered to a tool: the `host` and `port` it names, and
/// the addresses the appliance connects to for it.
pub type SiteEndpoint = (String, u16, Vec<SocketAddr>);

/// Where a tool with a mount namespace of its own finds its working
/// directory: a place of the host's that no tool is granted (none of
/// `/var` is), so that hiding it hides nothing a tool may use; a release
/// cannot ask to read it.
pub const TOOL_WORKDIR: &str = "/var/tmp";

/// The protected root `grant` is at, above or below, if any.
pub fn protected_conflict<'a>(grant: &Path, protected: &'a [PathBuf]) -> Option<&'a Path> {
    protected
        .iter()
        .find(|p| grant.starts_with(p) || p.starts_with(grant))
        .map(PathBuf::as_path)
}

/// Why a path a release declares in `readPaths` may not be granted: not
/// absolute and plain, protected, or outside what the site allows.
pub fn read_path_refusal(path: &str, protected: &[PathBuf], allowed: &[PathBuf]) -> Option<String> {
    let p = Path::new(path);
    if !p.is_absolute()
        || p.components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Some(format!(
            "read path {path:?} is not an absolute path without . or .."
        ));
    }
    if let Some(root) = protected_conflict(p, protected) {
        return Some(format!(
            "read path {path} is at, above or below the protected path {}: no tool may read it",
            root.display()
        ));
    }
    if p.starts_with(TOOL_WORKDIR) {
        return Some(format!(
            "read path {path} is inside {TOOL_WORKDIR}, where a tool finds its own working directory"
        ));
    }
    if !allowed.iter().any(|a| p.starts_with(a)) {
        return Some(format!(
            "read path {path} is not inside a path the site allows tools to read (runtime.tool_read_allow: {})",
            if allowed.is_empty() {
                "none".to_string()
            } else {
                allowed
                    .iter()
                    .map(|a| a.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
    }
    None
}

/// Refuses a URL that carries a user name or password before its host: a
/// URL is stored, logged and shown, a credential must not be. The refusal
/// names where a credential goes instead, and not the credential.
pub fn credential_free(url: &url::Url) -> Result<(), String> {
    if url.username().is_empty() && url.password().is_none() {
        return Ok(());
    }
    Err(format!(
        "{} carries credentials before its host (user:password@); a URL is stored and shown, so it may not: a model server's key goes under [runtime.model_api_keys], named by its profile's apiKeyRef; a webhook is signed with the secret the appliance gives it; a site endpoint's credential belongs to the tool, which sends it",
        redacted(url.as_str())
    ))
}

/// `text` with any credentials of a URL in it replaced by `***` (for
/// messages and displays of what was stored before they were refused).
pub fn redacted(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut url) if !url.username().is_empty() || url.password().is_some() => {
            let _ = url.set_username("***");
            let _ = url.set_password(None);
            url.to_string()
        }
        Ok(_) => text.to_string(),
        // Not a URL: whatever sits between `://` and an `@` is cut.
        Err(_) => match (text.find("://"), text.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}://***{}", &text[..scheme], &text[at..])
            }
            _ => text.to_string(),
        },
    }
}

/// One entry of the site's network allowlist: an exact `host:port`, or a
/// URL prefix (`https://host[:port]/path`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Allowed {
    /// Exactly this host and port.
    HostPort(String, u16),
    /// Every URL that starts with this one (scheme, host, port and path).
    UrlPrefix(Target, String),
}

impl TryFrom<String> for Allowed {
    type Error = String;
    fn try_from(entry: String) -> Result<Allowed, String> {
        if entry.contains("://") {
            let target = Target::of_url(&entry)?;
            Ok(Allowed::UrlPrefix(target, entry))
        } else {
            let t = Target::of_host_port(&entry)?;
            Ok(Allowed::HostPort(t.host, t.port))
        }
    }
}

impl From<Allowed> for String {
    fn from(a: Allowed) -> String {
        match a {
            Allowed::HostPort(h, p) => host_port(&h, p),
            Allowed::UrlPrefix(_, url) => url,
        }
    }
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A network target a release names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Host name or address, lower case, without brackets.
    pub host: String,
    /// Port (the scheme's default for a URL without one).
    pub port: u16,
    /// The URL, for URL targets.
    pub url: Option<String>,
}

impl Target {
    /// A `host:port` target.
    pub fn of_host_port(s: &str) -> Result<Target, String> {
        let (host, port) = s
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty())
            .ok_or_else(|| format!("{s:?} is not host:port"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{s:?} has no port"))?;
        Ok(Target {
            host: host.trim_matches(['[', ']']).to_ascii_lowercase(),
            port,
            url: None,
        })
    }

    /// A URL target (`http` or `https`), without credentials
    /// ([`credential_free`]).
    pub fn of_url(s: &str) -> Result<Target, String> {
        let url = url::Url::parse(s).map_err(|_| format!("{:?} is not a URL", redacted(s)))?;
        credential_free(&url)?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{s:?} is not an http or https URL"));
        }
        let host = url
            .host_str()
            .ok_or_else(|| format!("{s:?} names no host"))?
            .trim_matches(['[', ']'])
            .to_ascii_lowercase();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| format!("{s:?} has no port"))?;
        Ok(Target {
            host,
            port,
            url: Some(url.to_string()),
        })
    }

    /// `host:port`, as messages name it.
    pub fn host_port(&self) -> String {
        host_port(&self.host, self.port)
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.url {
            Some(u) => f.write_str(u),
            None => f.write_str(&self.host_port()),
        }
    }
}

/// Whether an address is one a release never reaches but by an exact
/// entry: loopback, unspecified, link-local (cloud metadata among them),
/// IPv6 unique-local metadata, or one of the appliance's own listeners.
pub fn is_sensitive(ip: IpAddr, port: u16, own: &[SocketAddr]) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    let special = match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_unspecified()
                || v4.is_link_local()
                // Alibaba Cloud's metadata service (the others are link-local).
                || v4.octets() == [100, 100, 100, 200]
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                // The EC2 metadata service's IPv6 address.
                || v6.segments() == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254]
        }
    };
    special
        || own
            .iter()
            .any(|l| l.port() == port && (l.ip().is_unspecified() || l.ip() == ip))
}

/// Why `target` may not be reached by a release, given the allowlist that
/// applies (the site's and the tenant's entries) and the addresses its
/// host resolves to (empty at import, where nothing is resolved).
pub fn target_refusal(
    what: &str,
    target: &Target,
    allow: &[Allowed],
    resolved: &[IpAddr],
    own: &[SocketAddr],
) -> Option<String> {
    let exact = allow
        .iter()
        .any(|a| matches!(a, Allowed::HostPort(h, p) if *h == target.host && *p == target.port));
    let by_prefix = target.url.as_deref().is_some_and(|url| {
        allow.iter().any(|a| match a {
            Allowed::UrlPrefix(t, prefix) => {
                t.host == target.host && t.port == target.port && url.starts_with(prefix.as_str())
            }
            Allowed::HostPort(..) => false,
        })
    });
    if !exact && !by_prefix {
        return Some(format!(
            "{what} {target} is not in the site's network allowlist (runtime.network_allow{})",
            if allow.is_empty() {
                ", which is empty".to_string()
            } else {
                format!(
                    ": {}",
                    allow
                        .iter()
                        .map(|a| String::from(a.clone()))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
    }
    let literal = target.host.parse::<IpAddr>().ok();
    // One rule for every entry: what a name resolves to is judged, so an
    // exact entry by name (`vm:8080`, where `vm` is 127.0.0.1) reaches no
    // more than a URL prefix of the same name. Only an entry that writes
    // the literal address and port opens a sensitive one.
    if exact && literal.is_some() {
        return None;
    }
    let named_local = target.host == "localhost" || target.host.ends_with(".localhost");
    let sensitive: Vec<IpAddr> = literal
        .iter()
        .chain(resolved)
        .copied()
        .filter(|ip| is_sensitive(*ip, target.port, own))
        .collect();
    if sensitive.is_empty() && !named_local {
        return None;
    }
    let example = sensitive
        .first()
        .map(|ip| host_port(&ip.to_string(), target.port))
        .unwrap_or_else(|| format!("127.0.0.1:{}", target.port));
    Some(if literal.is_some() {
        format!(
            "{what} {target} is loopback, link-local or the appliance's own listener: only an exact {example} entry in runtime.network_allow allows it"
        )
    } else {
        format!(
            "{what} {target} names a host that is or resolves to a loopback, link-local or metadata address or the appliance's own listener ({}): only an exact entry that writes the address and port ({example}) in runtime.network_allow allows it",
            if sensitive.is_empty() {
                target.host.clone()
            } else {
                sensitive
                    .iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )
    })
}

/// The site's rules for one tenant's releases, as they stand now.
#[derive(Clone, Debug, Default)]
pub struct SiteReach {
    /// Paths no tool may be granted, nor anything above or below them.
    pub protected: Vec<PathBuf>,
    /// Where `readPaths` may point (`runtime.tool_read_allow`).
    pub read_allow: Vec<PathBuf>,
    /// The network allowlist that applies to the tenant.
    pub allow: Vec<Allowed>,
    /// The appliance's own listeners.
    pub own: Vec<SocketAddr>,
}

impl SiteReach {
    /// Why a release may not be loaded here: the first path or target it
    /// names that the site does not allow (nothing is resolved at import).
    pub fn release_refusal(&self, manifest: &crate::domain::release::Manifest) -> Option<String> {
        use crate::domain::release::ToolTransport;
        for t in &manifest.tools {
            for p in &t.read_paths {
                if let Some(why) = read_path_refusal(p, &self.protected, &self.read_allow) {
                    return Some(format!("tool {}: {why}", t.id));
                }
            }
            for e in &t.site_endpoints {
                let refusal = Target::of_host_port(e)
                    .map_err(|why| format!("site endpoint {why}"))
                    .map(|target| self.target_refusal("site endpoint", &target, &[]));
                if let Some(why) = refusal.unwrap_or_else(Some) {
                    return Some(format!("tool {}: {why}", t.id));
                }
            }
            if t.transport == ToolTransport::McpHttp
                && let Some(url) = &t.url
            {
                let refusal = Target::of_url(url)
                    .map(|target| self.target_refusal("MCP server", &target, &[]));
                if let Some(why) = refusal.unwrap_or_else(Some) {
                    return Some(format!("tool {}: {why}", t.id));
                }
            }
        }
        if let Some(url) = &manifest.model_profile.endpoint {
            let refusal = Target::of_url(url)
                .map(|target| self.target_refusal("model endpoint", &target, &[]));
            if let Some(why) = refusal.unwrap_or_else(Some) {
                return Some(format!("modelProfile: {why}"));
            }
        }
        None
    }

    /// [`target_refusal`] under these rules.
    pub fn target_refusal(
        &self,
        what: &str,
        target: &Target,
        resolved: &[IpAddr],
    ) -> Option<String> {
        target_refusal(what, target, &self.allow, resolved, &self.own)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protected() -> Vec<PathBuf> {
        [
            "/var/lib/agentbay",
            "/etc/agentbay",
            "/var/backups/agentbay",
        ]
        .map(PathBuf::from)
        .to_vec()
    }

    #[test]
    fn a_grant_at_above_or_below_a_protected_root_is_refused() {
        let p = protected();
        for grant in [
            "/var/lib/agentbay",
            "/var/lib/agentbay/tls",
            "/var/lib/agentbay/store/db",
            "/var/lib",
            "/var",
            "/",
            "/etc",
            "/etc/agentbay/agentbay.toml",
            "/var/backups/agentbay/agentbay-1.backup",
        ] {
            assert!(
                protected_conflict(Path::new(grant), &p).is_some(),
                "{grant} was granted"
            );
        }
        for grant in ["/usr", "/var/lib/agentbay-other", "/etc/ssl", "/opt/tools"] {
            assert_eq!(protected_conflict(Path::new(grant), &p), None, "{grant}");
        }
    }

    #[test]
    fn declared_read_paths_need_the_sites_allowance_and_no_protected_root() {
        let p = protected();
        let allowed = vec![PathBuf::from("/srv/models"), PathBuf::from("/var")];
        assert_eq!(read_path_refusal("/srv/models/llama", &p, &allowed), None);
        let e = read_path_refusal("/var/lib/agentbay/tls", &p, &allowed).unwrap();
        assert!(e.contains("protected path /var/lib/agentbay"), "{e}");
        let e = read_path_refusal("/var/lib", &p, &allowed).unwrap();
        assert!(e.contains("protected"), "{e}");
        let e = read_path_refusal("/home/u", &p, &allowed).unwrap();
        assert!(
            e.contains("runtime.tool_read_allow: /srv/models, /var"),
            "{e}"
        );
        let e = read_path_refusal("/srv/models/../../var/lib/agentbay", &p, &allowed).unwrap();
        assert!(e.contains("without . or .."), "{e}");
        let e = read_path_refusal("/var/tmp/x", &p, &allowed).unwrap();
        assert!(e.contains("working directory"), "{e}");
        let e = read_path_refusal("models", &p, &allowed).unwrap();
        assert!(e.contains("absolute"), "{e}");
    }

    fn allow(entries: &[&str]) -> Vec<Allowed> {
        entries
            .iter()
            .map(|e| Allowed::try_from(e.to_string()).unwrap())
            .collect()
    }

    #[test]
    fn a_target_must_be_listed() {
        let own = ["127.0.0.1:8443".parse().unwrap()];
        let list = allow(&["tickets.site:443", "https://tools.site/mcp/"]);
        let t = Target::of_host_port("tickets.site:443").unwrap();
        assert_eq!(target_refusal("site endpoint", &t, &list, &[], &own), None);
        let t = Target::of_host_port("tickets.site:444").unwrap();
        let e = target_refusal("site endpoint", &t, &list, &[], &own).unwrap();
        assert!(
            e.contains("site endpoint tickets.site:444 is not in"),
            "{e}"
        );
        let e = Target::of_url("https://bot:hunter2@hooks.site/x").unwrap_err();
        assert!(
            e.contains("carries credentials") && !e.contains("hunter2"),
            "{e}"
        );
        assert!(e.contains("https://***@hooks.site/x"), "{e}");
        let e = Target::of_url("https://token@hooks.site/x").unwrap_err();
        assert!(!e.contains("token@"), "{e}");
        assert_eq!(redacted("https://a:b@h/x"), "https://***@h/x");
        assert_eq!(redacted("https://h/x"), "https://h/x");
        let t = Target::of_url("https://tools.site/mcp/search").unwrap();
        assert_eq!(target_refusal("MCP server", &t, &list, &[], &own), None);
        let t = Target::of_url("https://tools.site/admin").unwrap();
        assert!(target_refusal("MCP server", &t, &list, &[], &own).is_some());
        let e = target_refusal("MCP server", &t, &[], &[], &own).unwrap();
        assert!(e.contains("which is empty"), "{e}");
    }

    #[test]
    fn loopback_link_local_and_own_listeners_need_an_exact_entry() {
        let own: Vec<SocketAddr> = vec!["0.0.0.0:8443".parse().unwrap()];
        let list = allow(&[
            "http://127.0.0.1:18999/",
            "http://tools.site:8443/",
            "http://169.254.169.254/",
            "127.0.0.1:9000",
        ]);
        for url in [
            "http://127.0.0.1:18999/internal-admin",
            "http://169.254.169.254/latest/meta-data",
        ] {
            let t = Target::of_url(url).unwrap();
            let e = target_refusal("MCP server", &t, &list, &[], &own).unwrap();
            assert!(e.contains("only an exact"), "{url}: {e}");
        }
        // A name that resolves to the appliance's own listener.
        let t = Target::of_url("http://tools.site:8443/x").unwrap();
        let e = target_refusal(
            "MCP server",
            &t,
            &list,
            &["10.1.2.3".parse().unwrap()],
            &own,
        )
        .unwrap();
        assert!(e.contains("own listener"), "{e}");
        let t = Target::of_host_port("127.0.0.1:9000").unwrap();
        assert_eq!(target_refusal("site endpoint", &t, &list, &[], &own), None);
        // An exact entry by name is judged on what the name resolves to,
        // as a URL prefix of the same name is: a name for 127.0.0.1 is no
        // way around the literal entry.
        let named = allow(&["vm:9000", "http://vm:9000/"]);
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        for t in [
            Target::of_host_port("vm:9000").unwrap(),
            Target::of_url("http://vm:9000/hook").unwrap(),
        ] {
            assert_eq!(
                target_refusal("webhook endpoint", &t, &named, &[], &own),
                None
            );
            let e = target_refusal("webhook endpoint", &t, &named, &[loopback], &own).unwrap();
            assert!(
                e.contains("resolves to") && e.contains("127.0.0.1:9000"),
                "{t}: {e}"
            );
            assert_eq!(
                target_refusal(
                    "webhook endpoint",
                    &t,
                    &named,
                    &["10.0.0.7".parse().unwrap()],
                    &own
                ),
                None
            );
        }
        let t = Target::of_host_port("localhost:9000").unwrap();
        assert!(
            target_refusal("site endpoint", &t, &allow(&["localhost:9000"]), &[], &own).is_some()
        );
        let t = Target::of_host_port("[::ffff:127.0.0.1]:9001").unwrap();
        assert!(
            target_refusal(
                "site endpoint",
                &t,
                &allow(&["http://[::ffff:127.0.0.1]:9001/"]),
                &[],
                &[]
            )
            .is_some()
        );
        assert!(is_sensitive("fe80::1".parse().unwrap(), 1, &[]));
        for metadata in ["169.254.169.254", "100.100.100.200", "fd00:ec2::254"] {
            assert!(
                is_sensitive(metadata.parse().unwrap(), 80, &[]),
                "{metadata}"
            );
        }
        assert!(!is_sensitive(
            "10.0.0.5".parse().unwrap(),
            8443,
            &["127.0.0.1:8443".parse().unwrap()]
        ));
    }

    #[test]
    fn allowlist_entries_round_trip_and_bad_ones_are_named() {
        for e in ["tickets.site:443", "https://tools.site/mcp/", "[::1]:8000"] {
            let a = Allowed::try_from(e.to_string()).unwrap();
            assert_eq!(String::from(a), e);
        }
        assert!(
            Allowed::try_from("tickets.site".to_string())
                .unwrap_err()
                .contains("host:port")
        );
        assert!(
            Allowed::try_from("ftp://x/".to_string())
                .unwrap_err()
                .contains("http")
        );
    }
}
