import grp
import os
import pwd
import stat
from pathlib import Path

import pytest


def test_devs_group():
    g = grp.getgrnam("devs")
    assert g.gr_gid == 2000
    assert set(g.gr_mem) >= {"alice", "bob"}


@pytest.mark.parametrize("name,uid", [("alice", 2001), ("bob", 2002)])
def test_user(name, uid):
    u = pwd.getpwnam(name)
    assert u.pw_uid == uid
    assert u.pw_gid == uid and grp.getgrgid(uid).gr_name == name
    assert u.pw_dir == f"/home/{name}"
    assert u.pw_shell == "/bin/bash"
    home = Path(u.pw_dir)
    assert home.is_dir() and home.stat().st_uid == uid
    groups = {g.gr_name for g in grp.getgrall() if name in g.gr_mem}
    assert "devs" in groups


def test_project_dir():
    st = os.stat("/srv/project")
    assert st.st_uid == pwd.getpwnam("alice").pw_uid
    assert st.st_gid == 2000
    assert stat.S_IMODE(st.st_mode) == 0o2770


def test_project_contents():
    files = {str(p.relative_to("/srv/project")): p for p in Path("/srv/project").rglob("*")}
    assert set(files) == {"plan.md", "todo.txt", "designs", "designs/mock.svg"}
    assert files["plan.md"].read_text() == "plan v1\n"
    for p in files.values():
        st = p.stat()
        assert st.st_uid == 2001 and st.st_gid == 2000, p
        assert st.st_mode & stat.S_IRGRP and st.st_mode & stat.S_IWGRP, p


def test_olduser_removed():
    with pytest.raises(KeyError):
        pwd.getpwnam("olduser")
    with pytest.raises(KeyError):
        grp.getgrnam("olduser")
    assert not Path("/home/olduser").exists()
