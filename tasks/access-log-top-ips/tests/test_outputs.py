import hashlib
from pathlib import Path


def lines(path):
    return [l.rstrip("\n") for l in Path(path).read_text().splitlines() if l.strip()]


def test_log_untouched():
    assert hashlib.sha256(Path("/app/access.log").read_bytes()).hexdigest() == LOG_SHA


def test_top_ips_exact():
    assert lines("/app/top_ips.txt") == [
        "61 203.0.113.7",
        "48 198.51.100.23",
        "40 192.0.2.14",
        "33 203.0.113.99",
        "27 10.0.0.5",
    ]


def test_top_ips_does_not_merge_prefix_addresses():
    # 10.0.0.5 and 10.0.0.50 are different clients
    assert "22 10.0.0.50" not in lines("/app/top_ips.txt")
    assert "49 10.0.0.5" not in lines("/app/top_ips.txt")


def test_not_found_paths():
    got = lines("/app/not_found.txt")
    assert sorted(l.split()[1] for l in got) == sorted(
        ["/.env", "/api/v0/items", "/backup.zip", "/old-page", "/robots.txt", "/wp-admin.php"])


def test_not_found_order_and_counts():
    assert lines("/app/not_found.txt") == [
        "6 /api/v0/items",
        "6 /backup.zip",
        "6 /robots.txt",
        "5 /wp-admin.php",
        "4 /.env",
        "3 /old-page",
    ]
LOG_SHA = "f154c26d1f3958154321728731086757bda94d94025a91e9fbda126b38712c7c"
