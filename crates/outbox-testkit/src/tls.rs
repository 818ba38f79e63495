//! Certificates for TLS tests, made with the `openssl` CLI in a temp dir: a CA, a server
//! certificate it signs for `localhost` (and 127.0.0.1), and an unrelated second CA that a
//! client must refuse to trust for that server.
//!
//! Test material only: the keys live in the temp dir and must never be used outside a test.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::chown_to;

pub struct TestCerts {
    dir: tempfile::TempDir,
    /// The CA that signed the server certificate.
    pub ca: PathBuf,
    /// A CA that signed nothing the servers present.
    pub wrong_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TestCerts {
    /// Makes the files, owned by `owner` (the server's user: PostgreSQL refuses a key file
    /// that is not its own or is readable by others).
    pub fn generate(owner: &str) -> TestCerts {
        let dir = tempfile::Builder::new()
            .prefix("outbox-test-certs-")
            .tempdir()
            .expect("create a temp dir for certificates");
        let path = |name: &str| dir.path().join(name);
        let ca_ext = [
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ];
        for name in ["ca", "wrong_ca"] {
            let subject = format!("/CN=outbox-relay test {name}");
            openssl(
                dir.path(),
                &[
                    &[
                        "req",
                        "-x509",
                        "-newkey",
                        "ec",
                        "-pkeyopt",
                        "ec_paramgen_curve:prime256v1",
                    ][..],
                    &["-nodes", "-days", "2", "-subj", &subject],
                    &[
                        "-keyout",
                        &format!("{name}.key"),
                        "-out",
                        &format!("{name}.pem"),
                    ],
                    &ca_ext,
                ]
                .concat(),
            );
        }
        openssl(
            dir.path(),
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                "/CN=localhost",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ],
        );
        std::fs::write(
            path("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write server.ext");
        openssl(
            dir.path(),
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path("server.key"), std::fs::Permissions::from_mode(0o600))
            .expect("chmod server.key");
        chown_to(dir.path(), owner);
        TestCerts {
            ca: path("ca.pem"),
            wrong_ca: path("wrong_ca.pem"),
            server_cert: path("server.crt"),
            server_key: path("server.key"),
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
