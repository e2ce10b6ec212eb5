#!/usr/bin/env python3
"""Checks that every relative markdown link in README.md and docs/*.md resolves: the file
exists, and an anchor matches a heading's GitHub slug in the target file."""
import re, sys, os
root = sys.argv[1] if len(sys.argv) > 1 else '.'
files = [os.path.join(root, 'README.md')] + sorted(
    os.path.join(root, 'docs', f) for f in os.listdir(os.path.join(root, 'docs')) if f.endswith('.md'))

def slugs(path):
    out, in_code = set(), False
    for line in open(path, encoding='utf-8'):
        if line.startswith('```'): in_code = not in_code; continue
        m = None if in_code else re.match(r'^(#{1,6})\s+(.*?)\s*$', line)
        if m:
            s = m.group(2).strip().lower()
            s = re.sub(r'[^\w\- ]', '', s)  # GitHub drops punctuation, keeps - and _
            s = s.replace(' ', '-')
            base, n = s, 1
            while s in out: s = f'{base}-{n}'; n += 1
            out.add(s)
    return out

bad = 0
for f in files:
    text = open(f, encoding='utf-8').read()
    text_nocode = re.sub(r'```.*?```', '', text, flags=re.S)
    for m in re.finditer(r'\]\(([^)\s]+)\)', text_nocode):
        target = m.group(1)
        if re.match(r'^[a-z]+:', target): continue  # http:, mailto:
        path, _, anchor = target.partition('#')
        dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        if not os.path.exists(dest):
            print(f'{f}: {target}: no file {dest}'); bad += 1; continue
        if anchor and dest.endswith('.md') and anchor not in slugs(dest):
            print(f'{f}: {target}: no heading #{anchor} in {dest}'); bad += 1
print(f'{len(files)} files checked, {bad} broken links')
sys.exit(1 if bad else 0)
