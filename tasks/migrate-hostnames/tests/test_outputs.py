from pathlib import Path

import pytest

EXPECTED = {
    'README.txt': 'Hosts: db01.old-dc.internal (primary), cache01.old-dc.internal.\nThis file is documentation and must not be rewritten.\n',
    'app.conf': '# main application config\n[database]\nhost = db-primary.new-dc.internal\nport = 5432\nreplica = db011.old-dc.internal\n\n[cache]\nurl = redis://cache.new-dc.internal:6379/0\n',
    'archive/app-2019.conf': 'host = db01.old-dc.internal\ncache = cache01.old-dc.internal\n',
    'env/production.env': 'DB_HOST=db-primary.new-dc.internal\nDB_REPLICA=db011.old-dc.internal\nCACHE_HOST=cache.new-dc.internal\n',
    'env/staging.env': 'DB_HOST=db01.staging.internal\nCACHE_HOST=cache01.staging.internal\n',
    'services/api.yaml': 'api:\n  listen: 0.0.0.0:8080\n  upstreams: [db-primary.new-dc.internal, db-primary.new-dc.internal]\n',
    'services/worker.yaml': 'worker:\n  queue: "amqp://mq.old-dc.internal:5672"\n  database: "postgres://app@db-primary.new-dc.internal:5432/app"\n  cache_hosts:\n    - cache.new-dc.internal\n    - cache02.old-dc.internal\n',
}
CHANGED = ['app.conf', 'env/production.env', 'services/api.yaml', 'services/worker.yaml']


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_file_content(rel):
    assert (Path("/app/config") / rel).read_text() == EXPECTED[rel]


def test_no_old_hosts_left_in_live_configs():
    for rel in EXPECTED:
        if rel.startswith("archive/") or not rel.endswith((".conf", ".yaml", ".env")):
            continue
        text = (Path("/app/config") / rel).read_text()
        assert "db01.old-dc.internal" not in text and "cache01.old-dc.internal" not in text


def test_no_stray_files():
    files = sorted(str(p.relative_to("/app/config")) for p in Path("/app/config").rglob("*") if p.is_file())
    assert files == sorted(EXPECTED)


def test_changed_files_list():
    got = [l.strip() for l in Path("/app/changed_files.txt").read_text().splitlines() if l.strip()]
    assert got == CHANGED
