#!/bin/bash
groupadd -g 2000 devs
groupadd -g 2001 alice
groupadd -g 2002 bob
useradd -m -u 2001 -g alice -G devs -s /bin/bash alice
useradd -m -u 2002 -g bob -G devs -s /bin/bash bob
chown -R alice:devs /srv/project
chmod -R g+rw /srv/project
chmod 2770 /srv/project
userdel -r olduser
getent group olduser && groupdel olduser
id alice; id bob; ls -la /srv/project
