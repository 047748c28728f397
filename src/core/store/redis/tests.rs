use super::*;

#[test]
fn servers_older_than_redis_7_or_valkey_7_2_are_refused() {
    let info = |lines: &[&str]| format!("# Server\r\n{}\r\n", lines.join("\r\n"));
    for ok in [
        info(&["redis_version:7.0.0", "redis_mode:standalone"]),
        info(&["redis_version:7.4.2"]),
        info(&["redis_version:10.1.0"]),
        info(&["redis_version:7.2.4", "server_name:valkey", "valkey_version:8.0.1"]),
        info(&["redis_version:7.2.4", "server_name:valkey"]),
        info(&["something_else:1"]),
    ] {
        assert_eq!(check_version(&ok), Ok(()), "{ok}");
    }
    for (old, says) in [
        (info(&["redis_version:6.2.14", "redis_mode:standalone"]), "Redis 6.2.14"),
        (info(&["redis_version:5.0.7"]), "Redis 5.0.7"),
        (info(&["redis_version:7.0.0", "server_name:valkey", "valkey_version:7.1.9"]), "Valkey 7.1.9"),
        (info(&["redis_version:7.0.0", "server_name:valkey"]), "Valkey 7.0.0"),
    ] {
        let err = check_version(&old).expect_err(&old);
        assert!(err.contains(says) && err.contains("needs Redis 7.0"), "{err}");
    }
}

#[test]
fn error_replies_that_waiting_cures_are_outages_the_others_are_not() {
    let server = |line: &str| -> redis::RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(Value::ServerError(e)) => e.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    };
    for line in [
        "WRONGTYPE Operation against a key holding the wrong kind of value script: 1b2c",
        "ERR user_script:12: Script attempted to access nonexistent global variable 'x'",
        "ERR Invalid stream ID specified as stream command argument",
        "NOPERM this user has no permissions to run the 'evalsha' command",
    ] {
        assert!(matches!(store_error(&server(line), true), StoreError::Rejected(_)), "{line}");
    }
    for line in [
        "LOADING Redis is loading the dataset in memory",
        "BUSY Redis is busy running a script",
        "READONLY You can't write against a read only replica.",
        "MASTERDOWN Link with MASTER is down",
        "OOM command not allowed when used memory > 'maxmemory'.",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist",
        "ERR max number of clients reached",
    ] {
        assert!(matches!(store_error(&server(line), true), StoreError::Unavailable(_)), "{line}");
    }
    let cut = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    assert!(matches!(store_error(&cut, true), StoreError::InDoubt(_)));
    assert!(matches!(store_error(&cut, false), StoreError::Unavailable(_)));
}
