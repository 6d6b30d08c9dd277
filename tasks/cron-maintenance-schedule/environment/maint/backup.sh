#!/bin/bash
# backup job (placeholder)
echo "backup done"
