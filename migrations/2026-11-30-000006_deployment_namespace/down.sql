DROP TABLE deployment;
