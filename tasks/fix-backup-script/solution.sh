#!/bin/bash
cat > /app/backup.sh <<'SH'
#!/bin/bash
# backup.sh SRC DEST - copy the .txt and .md files of SRC into DEST, keeping the folder layout.
SRC=${1%/}
DEST=${2%/}

if [ -z "$SRC" ] || [ ! -d "$SRC" ]; then
    echo "source directory not found: $1" >&2
    exit 2
fi

mkdir -p "$DEST"
list=$(mktemp)
count=0
while IFS= read -r -d '' f; do
    rel=${f#"$SRC"/}
    mkdir -p "$DEST/$(dirname "$rel")"
    cp -- "$f" "$DEST/$rel"
    printf '%s\n' "$rel" >> "$list"
    count=$((count + 1))
done < <(find "$SRC" -type f \( -name '*.txt' -o -name '*.md' \) -print0)

LC_ALL=C sort "$list" > "$DEST/MANIFEST"
rm -f "$list"
echo "backed up $count files"
exit 0
SH
chmod +x /app/backup.sh
bash /app/backup.sh /app/notes /tmp/notes-backup
