import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from pydantic import SecretStr

from hybridtrain.errors import RemoteJobFailed, SpecError, is_retryable
from hybridtrain.remote.ssh_site import known_hosts_name, load_private_key, parse_known_hosts


def openssh_key(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption()).decode()


def public_b64(key) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return raw.decode().split()[1]


def test_keys_load_from_block_text_in_openssh_and_pem_form():
    ed = ed25519.Ed25519PrivateKey.generate()
    assert load_private_key(SecretStr(openssh_key(ed))).get_name() == "ssh-ed25519"
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())
    assert load_private_key(pem.decode()).get_name() == "ssh-rsa"


def test_unusable_keys_are_config_errors_that_never_echo_the_secret():
    junk = "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LXN0dWZm\n-----END OPENSSH PRIVATE KEY-----\n"
    with pytest.raises(SpecError) as exc:
        load_private_key(junk)
    assert exc.value.problems[0].path == "ssh_private_key" and "c2VjcmV0" not in str(exc.value)
    with pytest.raises(SpecError, match="no private key is set"):
        load_private_key(None)
    encrypted = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.BestAvailableEncryption(b"pw")).decode()
    with pytest.raises(SpecError, match="encrypted"):
        load_private_key(encrypted)


def test_known_hosts_text_names_non_default_ports_in_brackets_and_rejects_what_it_cannot_honour():
    assert known_hosts_name("gpu1", 22) == "gpu1" and known_hosts_name("10.0.0.5", 2222) == "[10.0.0.5]:2222"
    b64 = public_b64(ed25519.Ed25519PrivateKey.generate())
    pairs = parse_known_hosts(f"# pinned\n\n[10.0.0.5]:2222,gpu1 ssh-ed25519 {b64} comment\n")
    assert [(name, key.get_name()) for name, key in pairs] == [("[10.0.0.5]:2222", "ssh-ed25519"),
                                                             ("gpu1", "ssh-ed25519")]
    assert parse_known_hosts(None) == []
    with pytest.raises(SpecError) as exc:
        parse_known_hosts(f"@revoked gpu1 ssh-ed25519 {b64}\ngpu2 ssh-ed25519\n"
                          f"gpu3 ssh-ed25519 {base64.b64encode(b'xx').decode()}!\n")
    assert [p.line for p in exc.value.problems] == [1, 2, 3]
    assert all(p.path == "ssh_known_hosts" for p in exc.value.problems)
    assert "@revoked is not supported" in exc.value.problems[0].message


def test_remote_job_failure_carries_status_and_tail_and_only_a_vanished_job_is_retried():
    failed = RemoteJobFailed("j1", "u@[h]:2222", 3, "step 1\nValueError: bad")
    assert failed.exit_status == 3 and not is_retryable(failed)
    assert "exit status 3" in str(failed) and "  | ValueError: bad" in str(failed)
    lost = RemoteJobFailed("j1", "u@[h]:2222", None, "")
    assert is_retryable(lost) and "vanished without an exit status" in str(lost) and "(the log is empty)" in str(lost)
