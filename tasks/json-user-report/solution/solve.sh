#!/bin/bash
cd /app
jq '[.users[] | select(.active and (.roles | index("admin"))) | {name, email: (.email | ascii_downcase)}] | sort_by(.email)' users.json > admins.json
jq '[.users[] | select(.active) | .roles[]] | group_by(.) | map({key: .[0], value: length}) | from_entries' users.json > role_counts.json
jq -r '[.users[] | select(.last_login == null) | .id] | sort | .[]' users.json > never_logged_in.txt
cat admins.json role_counts.json never_logged_in.txt
