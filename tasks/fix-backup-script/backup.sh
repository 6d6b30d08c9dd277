#!/bin/bash
# backup.sh SRC DEST - copy the .txt and .md files of SRC into DEST, keeping the folder layout.
SRC=$1
DEST=$2

if [ ! -d $SRC ]; then
    echo "source directory not found: $SRC"
    exit 1
fi

mkdir -p $DEST
count=0
for f in $(find $SRC -type f -name "*.txt" -o -name "*.md"); do
    rel=${f#$SRC}
    mkdir -p $DEST/$(dirname $rel)
    cp $f $DEST/$rel
    count=$((count++))
done

find $DEST -type f | sed "s|$DEST/||" | sort > $DEST/MANIFEST

if [ $count > 0 ]; then
    echo "backed up $count files"
fi
