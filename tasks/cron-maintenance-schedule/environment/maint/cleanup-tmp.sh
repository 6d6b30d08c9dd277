#!/bin/bash
# cleanup-tmp job (placeholder)
echo "cleanup-tmp done"
