#!/bin/bash
echo restart
